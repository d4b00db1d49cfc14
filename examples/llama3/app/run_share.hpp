// kvd-llama's prefix sharing (--remote, --prefix-store): the tier that shares the prompt's
// prefix between runs, connected to the run's manager, and what it served for the summary.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <sys/stat.h>

#include "kvdrive/kvdrive.hpp"
#include "kvdrive/tier/prefix_store.hpp"
#include "kvdrive/tier/remote_choice.hpp"
#include "model/model.hpp"
#include "app/run_options.hpp"
#include "app/run_prompt.hpp"  // read_text_file
#include "app/summary.hpp"

namespace kvdrive::llama {

/// --remote-secret-file: the file's bytes, less one trailing newline. A file that other users
/// may read is refused (as ssh refuses such a key): the secret is what keeps forged pages out.
inline std::string read_secret_file(const std::string& path) {
  struct stat st {};
  KVD_EXPECT(::stat(path.c_str(), &st) == 0, "--remote-secret-file {}: {}", path, std::strerror(errno));
  KVD_EXPECT((st.st_mode & 0077) == 0, "--remote-secret-file {}: other users may read or write it (mode {:o}); chmod 600 it", path,
             st.st_mode & 0777);
  std::string secret = read_text_file(path);
  if (secret.ends_with('\n')) secret.pop_back();
  if (secret.ends_with('\r')) secret.pop_back();
  return secret;
}

/// --remote or --prefix-store: the tier that shares the prompt's prefix (it outlives the manager
/// that reads and publishes through it) and the prompt tokens it shares page by page. Remote is
/// tier::NoRemote (sharing not built in: both options are refused) or a tier::RemoteChoice
/// holding a tier::PrefixStore, and a RedisTier when it names one as Remote::Redis (hiredis).
template <class Remote>
struct PrefixShare {
  static constexpr bool kBuiltIn = !std::is_same_v<Remote, tier::NoRemote>;
  static constexpr bool kRedis = requires { typename Remote::Redis; };
  std::conditional_t<kBuiltIn, Remote, int> remote{};
  bool on = false;
  std::vector<int> shared;  ///< the prompt's leading tokens whose whole pages are shared

  static void check(const SharingOptions& o, const std::string& device) {
    const char* what = !o.remote.empty() ? "--remote" : "--prefix-store";
    KVD_EXPECT(kBuiltIn || (o.remote.empty() && o.prefix_store.empty()), "{}: prefix sharing is not built into this run ({}; it needs --device cpu)",
               what, device);
    KVD_EXPECT(kRedis || o.remote.empty(), "--remote: this kvd-llama was built without hiredis (install libhiredis-dev and build again)");
    KVD_EXPECT(o.remote.empty() || o.prefix_store.empty(), "--remote and --prefix-store: choose one");
    KVD_EXPECT(o.shared_prefix >= -1, "--shared-prefix {}: expected a token count, or -1 for the whole prompt", o.shared_prefix);
    KVD_EXPECT(o.prefix_store_bytes > 0, "--prefix-store-bytes {}: expected a positive byte count", o.prefix_store_bytes);
  }

  /// Opens --prefix-store or connects to --remote, if given, and shares the prompt's prefix with `kv`.
  template <class Manager>
  void connect(const SharingOptions& o, const Model& model, Manager& kv, const std::vector<int>& prompt) {
    if constexpr (kBuiltIn) {
      if (!o.prefix_store.empty()) {
        remote.template emplace<tier::PrefixStore>(tier::PrefixStore::Params{
            .dir = o.prefix_store, .model = model_digest(model), .capacity_bytes = static_cast<std::uint64_t>(o.prefix_store_bytes)});
      } else if (!o.remote.empty()) {
        if constexpr (kRedis) {
          typename Remote::Redis::Params rp;
          rp.url = o.remote;
          rp.ttl_ms = o.remote_ttl_ms;
          rp.model = model_digest(model);
          if (!o.remote_secret_file.empty()) rp.secret = read_secret_file(o.remote_secret_file);
          remote.template emplace<typename Remote::Redis>(std::move(rp));
        }
      } else {
        return;
      }
      kv.share_prefixes(remote);
      on = true;
      const std::size_t n = o.shared_prefix < 0 ? prompt.size() : std::min<std::size_t>(prompt.size(), o.shared_prefix);
      shared.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(n));
    } else {
      (void)o, (void)model, (void)kv, (void)prompt;
    }
  }

  /// The summary's account of the sharing (none without --remote or --prefix-store).
  std::optional<RemoteSummary> summary() const {
    if constexpr (kBuiltIn) {
      if (!on) return std::nullopt;
      const tier::RemoteStats rs = remote.remote_stats();
      return RemoteSummary{
          remote.describe(), static_cast<std::int64_t>(shared.size()),     rs.hits, rs.missing, rs.corrupt, rs.errors + rs.lookup_errors,
          rs.written,        rs.write_errors + rs.over_budget + rs.dropped};
    } else {
      return std::nullopt;
    }
  }
};

}  // namespace kvdrive::llama
