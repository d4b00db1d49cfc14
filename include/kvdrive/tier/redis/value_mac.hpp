// redis::ValueMac: the keyed form of the remote value format, for deployments whose Redis server
// other clients can write to (Params::secret). Every engine of one deployment shares a secret;
// each value then carries an HMAC-SHA-256 (OpenSSL) of its key and its page under that secret,
// so a value that a client without the secret wrote (a recomputed plain checksum, or another
// deployment's MAC) fails it and is a miss, never data. The secret also names the deployment's
// key space (namespace()), so two deployments on one server do not even meet.
//
// Format: "KVDM" magic, page bytes (u32), the 32-byte tag, then the page. The tag is the HMAC of
// the key's length (u64), the key, and the page; it is compared in constant time.
#pragma once

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kvdrive/core/error.hpp"

namespace kvdrive::tier::redis {

class ValueMac {
 public:
  static constexpr std::uint32_t kMagic = 0x4D44564B;  // "KVDM"
  static constexpr std::size_t kTagBytes = 32;
  static constexpr std::size_t kHeaderBytes = 8 + kTagBytes;
  static constexpr std::size_t kMinSecretBytes = 16;

  /// Keys the MAC with `secret` (at least kMinSecretBytes bytes).
  explicit ValueMac(std::string_view secret) {
    KVD_EXPECT(secret.size() >= kMinSecretBytes, "RedisTier: the secret has {} bytes; a deployment's secret needs at least {}", secret.size(),
               kMinSecretBytes);
    mac_.reset(EVP_MAC_fetch(nullptr, "HMAC", nullptr));
    KVD_EXPECT(mac_ != nullptr, "RedisTier: OpenSSL has no HMAC");
    keyed_.reset(EVP_MAC_CTX_new(mac_.get()));
    char digest[] = "SHA256";
    const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_construct_end()};
    KVD_EXPECT(keyed_ != nullptr && EVP_MAC_init(keyed_.get(), reinterpret_cast<const unsigned char*>(secret.data()), secret.size(), params) == 1,
               "RedisTier: cannot key HMAC-SHA-256");
    // The namespace: the first 8 bytes of the MAC of a fixed label, in hex.
    unsigned char tag[kTagBytes];
    KVD_EXPECT(mac(std::string_view("kvdrive key namespace"), nullptr, 0, tag), "RedisTier: HMAC-SHA-256 failed");
    for (int i = 0; i < 8; ++i) ns_ += fmt::format("{:02x}", tag[i]);
  }

  /// 16 hex digits that name the deployment's keys (from the secret; it does not reveal it).
  const std::string& key_namespace() const { return ns_; }

  /// Writes header + page (kHeaderBytes + n bytes) into `out`.
  void encode(std::string_view key, const std::byte* page, std::size_t n, std::byte* out) const {
    const auto bytes = static_cast<std::uint32_t>(n);
    std::memcpy(out, &kMagic, 4);
    std::memcpy(out + 4, &bytes, 4);
    KVD_EXPECT(mac(key, page, n, reinterpret_cast<unsigned char*>(out + 8)), "RedisTier: HMAC-SHA-256 failed (out of memory?)");
    std::memcpy(out + kHeaderBytes, page, n);
  }

  /// Checks a value read for `key`; copies its page (n bytes) into dst only if its tag matches.
  bool decode(std::string_view key, const std::byte* value, std::size_t value_bytes, std::byte* dst, std::size_t n) const {
    if (value_bytes != kHeaderBytes + n) return false;
    std::uint32_t magic = 0, bytes = 0;
    std::memcpy(&magic, value, 4);
    std::memcpy(&bytes, value + 4, 4);
    if (magic != kMagic || bytes != n) return false;
    unsigned char tag[kTagBytes];
    if (!mac(key, value + kHeaderBytes, n, tag) || CRYPTO_memcmp(tag, value + 8, kTagBytes) != 0) return false;
    std::memcpy(dst, value + kHeaderBytes, n);
    return true;
  }

 private:
  struct FreeMac {
    void operator()(EVP_MAC* m) const { EVP_MAC_free(m); }
    void operator()(EVP_MAC_CTX* c) const { EVP_MAC_CTX_free(c); }
  };

  /// The tag of (key length, key, page), through a copy of the keyed context so that calls may
  /// run at once; false if OpenSSL failed (out of memory).
  bool mac(std::string_view key, const std::byte* page, std::size_t n, unsigned char* tag) const {
    std::unique_ptr<EVP_MAC_CTX, FreeMac> c(EVP_MAC_CTX_dup(keyed_.get()));
    const std::uint64_t len = key.size();
    std::size_t out = 0;
    const bool ok = c != nullptr && EVP_MAC_update(c.get(), reinterpret_cast<const unsigned char*>(&len), sizeof len) == 1 &&
                    EVP_MAC_update(c.get(), reinterpret_cast<const unsigned char*>(key.data()), key.size()) == 1 &&
                    (n == 0 || EVP_MAC_update(c.get(), reinterpret_cast<const unsigned char*>(page), n) == 1) &&
                    EVP_MAC_final(c.get(), tag, &out, kTagBytes) == 1 && out == kTagBytes;
    return ok;
  }

  std::unique_ptr<EVP_MAC, FreeMac> mac_;
  std::unique_ptr<EVP_MAC_CTX, FreeMac> keyed_;
  std::string ns_;
};

}  // namespace kvdrive::tier::redis
