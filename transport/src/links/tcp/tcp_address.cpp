// Which local address the tcp link binds to (setting comm.tcp.address).
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <arpa/inet.h>

#include <boost/asio/ip/address.hpp>
#include <memory>
#include <string>
#include <vector>

#include "trellis/core/error.hpp"

namespace trellis::transport::links {
namespace {

struct Interface {
  std::string name, address;
  bool up = false, loopback = false;
};

std::vector<Interface> ipv4_interfaces() {
  ifaddrs* list = nullptr;
  std::vector<Interface> out;
  if (getifaddrs(&list) != 0) return out;
  std::unique_ptr<ifaddrs, decltype(&freeifaddrs)> guard(list, freeifaddrs);
  for (auto* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    out.push_back({i->ifa_name, text, (i->ifa_flags & IFF_UP) != 0, (i->ifa_flags & IFF_LOOPBACK) != 0});
  }
  return out;
}

}  // namespace

// An IP address is used as given; an interface name gives its IPv4 address; empty picks
// the host's first up, non-loopback IPv4 interface (the one its hostname's traffic uses on
// the emulated cluster and on ordinary hosts), and loopback when it has none.
std::string choose_tcp_address(const std::string& setting) {
  auto ifs = ipv4_interfaces();
  if (!setting.empty()) {
    boost::system::error_code ec;
    boost::asio::ip::make_address(setting, ec);
    if (!ec) return setting;
    for (const auto& i : ifs)
      if (i.name == setting) return i.address;
    std::string names;
    for (const auto& i : ifs) names += (names.empty() ? "" : ", ") + i.name;
    throw_error(ErrorCode::kInvalidArgument,
                "comm.tcp.address = '{}': neither an IP address nor an interface with an IPv4 address here "
                "(interfaces: {})", setting, names);
  }
  for (const auto& i : ifs)
    if (i.up && !i.loopback) return i.address;
  return "127.0.0.1";
}

}  // namespace trellis::transport::links
