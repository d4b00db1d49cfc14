// tier::RedisUrl::parse (RedisTier's Params::url, kvd-llama --remote). Any string gives a
// kvdrive::Error or a URL that describes itself back: parsing describe() (password dropped, as
// it is masked there) gives the same host, port, socket, user and db.
#include <cstdlib>
#include <string>

#include "kvdrive/tier/redis_url.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using kvdrive::tier::RedisUrl;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    RedisUrl u = RedisUrl::parse(text);
    if (u.is_unix() == !u.host.empty()) std::abort();  // exactly one of TCP host and socket path
    if (!u.is_unix() && (u.port < 1 || u.port > 65535)) std::abort();
    if (u.db < 0) std::abort();
    u.password.clear();
    const std::string d = u.describe();
    // describe() does not escape: only URLs whose parts need no escaping can come back.
    const bool plain = u.user.find_first_of(":@/%[]?") == std::string::npos && u.host.find_first_of("@/?[]") == std::string::npos &&
                       u.socket_path.find('?') == std::string::npos && (u.is_unix() || !u.host.empty());
    if (!plain) return 0;
    const RedisUrl again = RedisUrl::parse(d);
    if (again.host != u.host || again.port != u.port || again.socket_path != u.socket_path || again.db != u.db ||
        (!u.is_unix() && again.user != u.user))
      std::abort();
  } catch (const kvdrive::Error&) {
  }
  return 0;
}
