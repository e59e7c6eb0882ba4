// Test hooks of the tcp link, for the fault tests (tests/transport/link_tcp_fault_test.cpp):
// they let a test play a misbehaving peer on a real connection. Not for production use.
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include "trellis/transport/link.hpp"

namespace trellis::transport::links::tcp {

// "ip:port" the transport listens on (it keeps accepting, and rejecting, after set-up).
std::string listen_address(Transport& tcp_transport);
// Writes raw bytes on the established connection to `peer`, bypassing framing.
void inject_raw(Transport& tcp_transport, int peer, std::span<const std::byte> bytes);
// Connections dropped so far because of a bad greeting, token or rank, a greeting that did
// not come in time, or too many waiting to authenticate.
int rejected_connections(Transport& tcp_transport);
// Incoming connections accepted and not yet authenticated (capped at 64).
std::size_t pending_strangers(Transport& tcp_transport);

}  // namespace trellis::transport::links::tcp
