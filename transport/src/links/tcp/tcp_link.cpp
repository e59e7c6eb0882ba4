// The tcp backend: Boost.Asio sockets driven without threads. Every socket is non-blocking
// and progress() does the reads and writes that are possible now, so a rank that waits on
// one request keeps every link moving and a rank that dies shows up as EOF or a reset.
//
// Security and isolation: each connection starts with a Hello that carries the job token
// (drawn on rank 0, handed out through the MPI bootstrap); a connection without it is
// dropped and logged, and so is any frame with a bad magic or a length above
// comm.tcp.max_frame. Frames are authenticated this way but not encrypted (README.md).
// The listening socket binds only to the chosen address: loopback when every peer is on
// this host, else comm.tcp.address or the host's first interface. An incoming connection
// must greet within comm.tcp.hello_timeout_ms, and at most kMaxStrangers unauthenticated
// ones are held at once (more are closed on accept), so strangers cannot pile up sockets.
#include <poll.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <map>
#include <set>

#include "src/links/common.hpp"
#include "src/links/tcp/tcp_testing.hpp"
#include "src/links/tcp/tcp_wire.hpp"
#include "src/wait.hpp"

namespace trellis::transport::links {

std::string choose_tcp_address(const std::string& setting);  // tcp_address.cpp

namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using namespace links::tcp;

constexpr std::size_t kInbufBytes = 64 << 10;
// Incoming connections held before they authenticate. Peers greet at once, and a transport
// has at most a few dozen of them, so more than this is someone else knocking.
constexpr std::size_t kMaxStrangers = 64;
// Rejections logged one by one; beyond this only every 1000th, so a flood cannot fill the log.
constexpr int kLoggedRejections = 20;

bool would_block(const boost::system::error_code& ec) {
  return ec == asio::error::would_block || ec == asio::error::try_again;
}

class TcpTransport;

class TcpLink final : public StreamLink<TcpLink> {
 public:
  TcpLink(TcpTransport& t, int peer, tcp::socket sock, std::uint64_t max_frame)
      : StreamLink(Backend::kTcp, peer), transport_(t), sock_(std::move(sock)), max_frame_(max_frame),
        inbuf_(kInbufBytes) {}

  // For StreamLink: write what the socket takes now / read what it has.
  void queue_send(std::shared_ptr<SendOp> op) {
    auto header = encode_frame_header({op->tag, op->data.size()});
    sends_.push_back({std::move(op), header, 0});
    flush();
  }
  void receive_now() { pump(); }

  void drive();
  void progress_once() {
    flush();
    pump();
  }
  void check_failed(const Request& r) const {
    if (!failed_.empty()) throw_scoped(ErrorScope::kLink, failed_code_, "{}: {}", r.describe(), failed_);
  }
  void finish_or_abandon(SendOp& op) {
    if (sends_.empty()) return;
    if (op.sent == 0 && sends_.front().op.get() != &op) {
      std::erase_if(sends_, [&](const Outgoing& o) { return o.op.get() == &op; });
      return;
    }
    auto until = Clock::now() + std::chrono::seconds(1);
    while (!op.complete && failed_.empty() && Clock::now() < until) drive();
    if (!op.complete) {
      std::erase_if(sends_, [&](const Outgoing& o) { return o.op.get() == &op; });
      fail(ErrorCode::kLinkFailed, fmt::format("a send to rank {} was abandoned mid-message", peer_));
    }
  }
  void write_raw(std::span<const std::byte> bytes) { asio::write(sock_, asio::buffer(bytes.data(), bytes.size())); }

 private:
  struct Outgoing {
    std::shared_ptr<SendOp> op;
    std::array<std::byte, kFrameHeaderBytes> header;
    std::size_t offset;  // bytes of header + payload written
  };
  void fail(ErrorCode code, std::string why) {
    if (!failed_.empty()) return;
    failed_ = std::move(why);
    failed_code_ = code;
    spdlog::error("tcp link to rank {}: {}", peer_, failed_);
    boost::system::error_code ignored;
    sock_.close(ignored);
  }
  void fail_io(const boost::system::error_code& ec, const char* op) {
    if (ec == asio::error::eof || ec == asio::error::connection_reset || ec == asio::error::broken_pipe)
      fail(ErrorCode::kPeerFailed, fmt::format("rank {} closed the connection (it exited or died)", peer_));
    else
      fail(ErrorCode::kLinkFailed, fmt::format("{} on the connection to rank {} failed: {}", op, peer_, ec.message()));
  }

  void flush() {
    while (!sends_.empty() && failed_.empty()) {
      Outgoing& o = sends_.front();
      const std::size_t total = kFrameHeaderBytes + o.op->data.size();
      std::array<asio::const_buffer, 2> bufs;
      std::size_t n = 0;
      if (o.offset < kFrameHeaderBytes)
        bufs[n++] = asio::buffer(o.header.data() + o.offset, kFrameHeaderBytes - o.offset);
      std::size_t pay = o.offset > kFrameHeaderBytes ? o.offset - kFrameHeaderBytes : 0;
      if (pay < o.op->data.size()) bufs[n++] = asio::buffer(o.op->data.data() + pay, o.op->data.size() - pay);
      boost::system::error_code ec;
      std::size_t wrote = sock_.write_some(std::span(bufs.data(), n), ec);
      if (ec) {
        if (!would_block(ec)) fail_io(ec, "write");
        return;
      }
      if (wrote > 0) detail::note_progress();
      o.offset += wrote;
      o.op->sent = o.offset > kFrameHeaderBytes ? o.offset - kFrameHeaderBytes : 0;
      if (o.offset < total) return;  // the socket buffer is full; try again later
      o.op->complete = true;
      sends_.pop_front();
    }
  }

  // Reads what the socket has: frame headers through a staging buffer (small messages
  // cost one read for many frames), large payloads straight into the receive buffer.
  void pump() {
    while (failed_.empty()) {
      if (!cur_.active) {
        if (end_ - begin_ < kFrameHeaderBytes) {
          if (!read_into_inbuf()) return;
          continue;
        }
        FrameHeader h;
        auto bad = check_frame_header(std::span<const std::byte, kFrameHeaderBytes>(inbuf_.data() + begin_, kFrameHeaderBytes),
                                      max_frame_, h);
        if (bad) return fail(ErrorCode::kCorruptInput, fmt::format("rank {} sent bad data ({}); connection dropped", peer_, *bad));
        begin_ += kFrameHeaderBytes;
        cur_.start(matcher_, h.tag, h.length, peer_);
        if (cur_.total == 0) cur_.finish(matcher_, peer_);
        continue;
      }
      std::size_t remaining = cur_.total - cur_.got;
      if (end_ > begin_) {
        std::size_t take = std::min(remaining, end_ - begin_);
        if (std::byte* dst = cur_.target()) std::memcpy(dst, inbuf_.data() + begin_, take);
        begin_ += take;
        advance(take);
        continue;
      }
      std::byte* dst = cur_.target();
      boost::system::error_code ec;
      std::size_t n = dst ? sock_.read_some(asio::buffer(dst, remaining), ec) : read_discard(remaining, ec);
      if (ec) {
        if (!would_block(ec)) fail_io(ec, "read");
        return;
      }
      detail::note_progress();
      advance(n);
    }
  }

  bool read_into_inbuf() {
    if (begin_ > 0) {
      std::memmove(inbuf_.data(), inbuf_.data() + begin_, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    boost::system::error_code ec;
    std::size_t n = sock_.read_some(asio::buffer(inbuf_.data() + end_, inbuf_.size() - end_), ec);
    if (ec) {
      if (!would_block(ec)) fail_io(ec, "read");
      return false;
    }
    end_ += n;
    detail::note_progress();
    return true;
  }
  std::size_t read_discard(std::size_t remaining, boost::system::error_code& ec) {
    begin_ = end_ = 0;
    return sock_.read_some(asio::buffer(inbuf_.data(), std::min(remaining, inbuf_.size())), ec);
  }

  void advance(std::size_t n) {
    cur_.got += n;
    if (cur_.got == cur_.total) cur_.finish(matcher_, peer_);
  }

  TcpTransport& transport_;
  tcp::socket sock_;
  std::uint64_t max_frame_;
  std::deque<Outgoing> sends_;
  std::vector<std::byte> inbuf_;
  std::size_t begin_ = 0, end_ = 0;
};

// A connection whose greeting has not been checked yet (either direction).
struct Pending {
  tcp::socket sock;
  int expected_peer;  // -1: an incoming connection, any expected rank
  std::array<std::byte, kHelloBytes> hello{};
  std::size_t got = 0;
  Clock::time_point since = Clock::now();
  std::string remote;
};

class TcpTransport final : public TransportOf<TcpLink> {
 public:
  // `handshake_timeout` bounds our own connections' wait for the answer, `hello_timeout`
  // an incoming connection's wait for its greeting.
  TcpTransport(int my_rank, int world_size, std::string token, std::uint64_t max_frame, Millis handshake_timeout,
               Millis hello_timeout)
      : TransportOf(Backend::kTcp), me_(my_rank), world_size_(world_size), token_(std::move(token)),
        max_frame_(max_frame), handshake_timeout_(handshake_timeout), hello_timeout_(hello_timeout), acceptor_(io_) {}
  // The links' sockets belong to io_: they go first (the base class would drop them after).
  ~TcpTransport() override { links_.clear(); }

  void listen(const std::string& address) {
    tcp::endpoint ep(asio::ip::make_address(address), 0);
    acceptor_.open(ep.protocol());
    acceptor_.bind(ep);
    acceptor_.listen();
    acceptor_.non_blocking(true);
    auto local = acceptor_.local_endpoint();
    listen_address_ = fmt::format("{}:{}", local.address().to_string(), local.port());
  }
  const std::string& listen_address() const { return listen_address_; }
  int rejected() const { return rejected_; }
  std::size_t strangers() const {
    return static_cast<std::size_t>(std::count_if(pending_.begin(), pending_.end(),
                                                  [](const auto& p) { return p->expected_peer < 0; }));
  }

  void expect(const std::vector<int>& peers) { expected_.insert(peers.begin(), peers.end()); }
  void connect_to(int peer, const std::string& address, Deadline d);
  void accept_and_greet();
  bool all_connected() const { return links_.size() == expected_.size(); }
  std::vector<int> missing() const {
    std::vector<int> out;
    for (int p : expected_)
      if (!links_.count(p)) out.push_back(p);
    return out;
  }

  Capabilities capabilities() const override { return {false, false, false, max_frame_}; }
  void progress() override {
    for (auto& [peer, l] : links_) l->progress_once();
    // Late connections (strangers, replays) are greeted and dropped; look every 10 ms.
    if (auto now = Clock::now(); now - last_accept_ > Millis(10)) {
      last_accept_ = now;
      accept_and_greet();
    }
  }
  std::string describe() const override { return fmt::format("tcp on {} ({} peers)", listen_address_, links_.size()); }

 private:
  void greet(Pending& p);
  void reject(Pending& p, const std::string& why) {
    ++rejected_;
    if (rejected_ <= kLoggedRejections || rejected_ % 1000 == 0)
      spdlog::warn("tcp: dropped connection from {}: {}{}", p.remote, why,
                   rejected_ == kLoggedRejections ? " (further ones are counted, and logged every 1000th)" : "");
    boost::system::error_code ignored;
    p.sock.close(ignored);
  }
  void establish(int peer, tcp::socket sock) {
    links_.emplace(peer, std::make_unique<TcpLink>(*this, peer, std::move(sock), max_frame_));
  }

  asio::io_context io_;
  int me_, world_size_;
  std::string token_;
  std::uint64_t max_frame_;
  Millis handshake_timeout_, hello_timeout_;
  tcp::acceptor acceptor_;
  std::string listen_address_;
  std::set<int> expected_;
  std::vector<std::unique_ptr<Pending>> pending_;
  int rejected_ = 0;
  Clock::time_point last_accept_ = Clock::now();
};

void TcpLink::drive() { transport_.progress(); }

std::string remote_of(const tcp::socket& s) {
  boost::system::error_code ec;
  auto ep = s.remote_endpoint(ec);
  return ec ? std::string("?") : fmt::format("{}:{}", ep.address().to_string(), ep.port());
}

void wait_writable(tcp::socket& s, Deadline d, int peer) {
  pollfd pfd{s.native_handle(), POLLOUT, 0};
  int ms = static_cast<int>(std::chrono::duration_cast<Millis>(d.remaining()).count());
  if (::poll(&pfd, 1, ms) <= 0)
    throw_error(ErrorCode::kTimeout, "tcp: connecting to rank {} did not finish before the deadline", peer);
}

// The connecting side: a non-blocking connect bounded by the deadline, then our Hello.
// The answer is read by greet() like any other pending connection.
void TcpTransport::connect_to(int peer, const std::string& address, Deadline d) {
  auto colon = address.rfind(':');
  tcp::endpoint ep(asio::ip::make_address(address.substr(0, colon)),
                   static_cast<unsigned short>(std::stoi(address.substr(colon + 1))));
  tcp::socket sock(io_);
  sock.open(ep.protocol());
  sock.non_blocking(true);
  boost::system::error_code ec;
  sock.connect(ep, ec);
  if (ec == asio::error::in_progress || would_block(ec)) {
    wait_writable(sock, d, peer);
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(sock.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len);
    ec.assign(err, boost::system::system_category());
  }
  if (ec) throw_error(ErrorCode::kLinkFailed, "tcp: connecting to rank {} at {} failed: {}", peer, address, ec.message());
  sock.set_option(tcp::no_delay(true));
  auto hello = encode_hello({kVersion, static_cast<std::uint32_t>(me_), static_cast<std::uint32_t>(peer), token_});
  sock.non_blocking(false);
  asio::write(sock, asio::buffer(hello));  // 52 bytes into a fresh socket buffer
  sock.non_blocking(true);
  auto p = std::make_unique<Pending>(Pending{std::move(sock), peer});
  p->remote = address;
  pending_.push_back(std::move(p));
}

void TcpTransport::accept_and_greet() {
  std::size_t strangers = this->strangers();
  for (;;) {
    boost::system::error_code ec;
    tcp::socket s(io_);
    acceptor_.accept(s, ec);
    if (ec) break;
    s.non_blocking(true);
    auto p = std::make_unique<Pending>(Pending{std::move(s), -1});
    p->remote = remote_of(p->sock);
    if (strangers >= kMaxStrangers) {
      reject(*p, fmt::format("{} connections are already waiting to authenticate", kMaxStrangers));
      continue;
    }
    ++strangers;
    pending_.push_back(std::move(p));
  }
  for (auto& p : pending_) greet(*p);
  std::erase_if(pending_, [](const auto& p) { return !p->sock.is_open(); });
}

// Reads a Hello; checks token and ranks; an accepted incoming connection gets our Hello back.
void TcpTransport::greet(Pending& p) {
  boost::system::error_code ec;
  std::size_t n = p.sock.read_some(asio::buffer(p.hello.data() + p.got, kHelloBytes - p.got), ec);
  if (ec && !would_block(ec)) return reject(p, "closed before greeting: " + ec.message());
  p.got += ec ? 0 : n;
  if (p.got < kHelloBytes) {
    const Millis limit = p.expected_peer < 0 ? hello_timeout_ : handshake_timeout_;
    if (Clock::now() - p.since > limit) reject(p, fmt::format("no greeting within {} ms", limit.count()));
    return;
  }
  Hello h;
  auto bad = check_hello(p.hello, token_, me_, world_size_, h);
  int from = static_cast<int>(h.from_rank);
  if (!bad && p.expected_peer >= 0 && from != p.expected_peer)
    bad = fmt::format("answered as rank {}, expected rank {}", from, p.expected_peer);
  if (!bad && !expected_.count(from)) bad = fmt::format("rank {} is not a peer of rank {} on this transport", from, me_);
  if (!bad && links_.count(from)) bad = fmt::format("rank {} is already connected", from);
  if (bad) return reject(p, *bad);
  if (p.expected_peer < 0) {
    auto reply = encode_hello({kVersion, static_cast<std::uint32_t>(me_), static_cast<std::uint32_t>(from), token_});
    p.sock.non_blocking(false);
    asio::write(p.sock, asio::buffer(reply), ec);
    p.sock.non_blocking(true);
    if (ec) return reject(p, "reply failed: " + ec.message());
    p.sock.set_option(tcp::no_delay(true));
  }
  establish(from, std::move(p.sock));
}

TcpTransport& as_tcp(Transport& t) {
  auto* tcp_t = dynamic_cast<TcpTransport*>(&t);
  if (!tcp_t) throw_error(ErrorCode::kInvalidArgument, "not a tcp transport: {}", t.describe());
  return *tcp_t;
}

}  // namespace

namespace tcp {
std::string listen_address(Transport& t) { return as_tcp(t).listen_address(); }
std::size_t pending_strangers(Transport& t) { return as_tcp(t).strangers(); }
void inject_raw(Transport& t, int peer, std::span<const std::byte> bytes) {
  static_cast<TcpLink&>(as_tcp(t).link(peer)).write_raw(bytes);
}
int rejected_connections(Transport& t) { return as_tcp(t).rejected(); }
}  // namespace tcp

std::unique_ptr<Transport> connect_tcp(Bootstrap& world, const std::vector<int>& peers, const Config& config) {
  auto settings = LinkSettings::from(config);
  auto d = Deadline::after(settings.connect_timeout);
  auto token = job_token(world, d);
  auto t = std::make_unique<TcpTransport>(world.rank(), world.size(), token, config.get_size("comm.tcp.max_frame"),
                                          settings.connect_timeout, config.get_duration("comm.tcp.hello_timeout_ms"));
  // Peers all on this host (a single-host job): nobody else needs to reach the listener, so
  // it binds loopback instead of the host's network interface.
  const auto hosts = allgather_strings(world, host_identity(world), d);
  const bool all_local = std::all_of(peers.begin(), peers.end(), [&](int p) { return hosts[p] == hosts[world.rank()]; });
  const std::string address = config.get_string("comm.tcp.address");
  std::string error;
  try {
    t->listen(address.empty() && all_local ? "127.0.0.1" : choose_tcp_address(address));
  } catch (const std::exception& e) {
    error = fmt::format("rank {}: {}", world.rank(), e.what());
  }
  if (world.any(!error.empty(), d))
    throw_error(ErrorCode::kIo, "tcp listen: {}", error.empty() ? "another rank failed (see its log)" : error);
  auto addresses = allgather_strings(world, t->listen_address(), d);
  t->expect(peers);
  try {
    for (int p : peers)
      if (p < world.rank()) t->connect_to(p, addresses[p], d);
    while (!t->all_connected() && !d.expired()) t->accept_and_greet();
    if (!t->all_connected())
      error = fmt::format("rank {}: no authenticated connection from rank(s) {} before the deadline", world.rank(),
                          fmt::join(t->missing(), ", "));
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (world.any(!error.empty(), d))
    throw_error(ErrorCode::kLinkFailed, "tcp connect: {}", error.empty() ? "another rank failed (see its log)" : error);
  return t;
}

}  // namespace trellis::transport::links
