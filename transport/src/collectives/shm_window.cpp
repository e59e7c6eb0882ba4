// Registered windows of the shm group (Group::allocate_window) and the zero-copy all-reduce
// on them.
//
// Every member's data already sits in a segment the others have mapped, so nobody copies
// anything in or out. Once every member has arrived (its data is in its region), rank r sums
// chunk r of every member's region, in rank order, and writes the sum into chunk r of every
// region; once every member is done, every region holds the whole result. Per rank and byte
// of a P = 2 all-reduce that is half the message read from each region and the reduced half
// written into both: about half the memory traffic of the copying path (fill, reduce and
// drain through the slot ring, shm_group.cpp), and no pieces to pipeline.
//
// Why it can work in place without a lock: during an operation rank r reads and writes only
// chunk r of each region, chunks are disjoint whole cache lines (relative to the operation's
// offset), and a member's region changes hands only at the two flags of its WindowLine:
//   arrive = w  my data for operation w is in my region (release: the caller's writes and the
//               descriptor come first); from now on the peers may read and overwrite their
//               chunks of it
//   done = w    I wrote chunk me of operation w into every region
// A member returns from operation w when every member is done with it, so its caller may
// rewrite the region then; nobody touches the region again before the member arrives at w + 1.
// Sums are formed in the same order as on the copying path, so both give the same bits.
#include "src/collectives/shm_window.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "src/collectives/shm_segment.hpp"

namespace trellis::transport::detail::shm {

// A window's segment, laid out as
//   WindowHeader | WindowLine[P] | region[P][stride]
// One line per member carries its progress through the zero-copy all-reduce (arrive, done:
// monotonic operation numbers) and the part of its region it passed (offset, count, dtype),
// which the peers check before reading it.
inline constexpr std::uint64_t kWindowMagic = 0x7472656c6c697377ull;  // "trellisw"
struct alignas(kLine) WindowHeader {
  std::uint64_t magic;
  std::uint64_t size;    // members
  std::uint64_t bytes;   // usable bytes per member
  std::uint64_t stride;  // bytes between two members' regions (page multiple)
};
struct alignas(kLine) WindowLine {
  std::atomic<std::uint64_t> arrive;  // operation w's data is in my region
  std::atomic<std::uint64_t> done;    // I wrote chunk me of operation w into every region
  std::uint64_t offset, count, dtype;  // operation `arrive`'s part of my region, written before it
};
static_assert(sizeof(WindowLine) == kLine);
inline constexpr std::size_t kPage = 4096;

struct ShmWindow {
  std::unique_ptr<ShmSegment> seg;
  WindowLine* lines = nullptr;
  std::byte* regions = nullptr;
  std::size_t bytes = 0, stride = 0;
  std::uint64_t seq = 0;  // operations on this window so far (the same on every member)
  std::byte* region(int r) const { return regions + static_cast<std::size_t>(r) * stride; }
};

namespace {

class WindowOp final : public ShmRequest {
 public:
  WindowOp(ShmSync& sync, ShmWindow& w, std::size_t offset, std::size_t count, DType dtype)
      : ShmRequest(sync), w_(w), offset_(offset), count_(count), dtype_(dtype), esize_(dtype_size(dtype)) {
    srcs_.resize(static_cast<std::size_t>(sync.size()));
    sync_.begin(this);  // the previous operation is complete: nobody reads my descriptor any more
    seq_ = ++w_.seq;
    WindowLine& mine = w_.lines[sync_.rank()];
    mine.offset = offset_;
    mine.count = count_;
    mine.dtype = static_cast<std::uint64_t>(dtype_);
    sync_.publish(mine.arrive, seq_);
  }
  ~WindowOp() override { abandon(); }

  std::size_t bytes() const override { return count_ * esize_; }
  std::string describe() const override {
    std::string what =
        fmt::format("all-reduce of {} elements in a registered window over {}", count_, sync_.who());
    if (complete()) return what;
    auto flag = reduced_ ? &WindowLine::done : &WindowLine::arrive;
    std::vector<int> missing;
    for (int r = 0; r < sync_.size(); ++r)
      if ((w_.lines[r].*flag).load(std::memory_order_acquire) < seq_) missing.push_back(sync_.members()[r]);
    if (!missing.empty())
      what += fmt::format(", waiting for world rank(s) {} to {} (a member that passed memory outside its window "
                          "all-reduces through the group's slots instead and never arrives here)",
                          list_ranks(missing), reduced_ ? "finish their chunks" : "arrive");
    return what;
  }

 private:
  // Two steps: reduce my chunk once everybody arrived, then finish once everybody is done.
  bool step() override {
    if (!reduced_ && all_at_least(&WindowLine::arrive)) {
      check_descriptors();
      reduce();
      reduced_ = true;
      sync_.publish(w_.lines[sync_.rank()].done, seq_);
      return true;
    }
    if (reduced_ && !done_ && all_at_least(&WindowLine::done)) {
      done_ = true;
      return true;
    }
    return false;
  }
  bool finished() const override { return done_; }
  bool movable() const override {
    return !reduced_ ? all_at_least(&WindowLine::arrive) : !done_ && all_at_least(&WindowLine::done);
  }
  bool all_at_least(std::atomic<std::uint64_t> WindowLine::*flag) const {
    for (int r = 0; r < sync_.size(); ++r)
      if ((w_.lines[r].*flag).load(std::memory_order_acquire) < seq_) return false;
    return true;
  }
  // Every member must have passed the same part of its window: a member at another offset
  // or count would have us read and write memory it is not reducing.
  void check_descriptors() const {
    for (int r = 0; r < sync_.size(); ++r) {
      const WindowLine& l = w_.lines[r];
      if (l.offset != offset_ || l.count != count_ || l.dtype != static_cast<std::uint64_t>(dtype_))
        throw_error(ErrorCode::kInvalidArgument,
                    "{}: world rank {} all-reduces {} elements ({}) at byte {} of its window, world rank {} {} "
                    "({}) at byte {}: every member must pass the same part of its window",
                    sync_.who(), sync_.members()[r], l.count, l.dtype == 0 ? "f32" : "bf16", l.offset,
                    sync_.members()[sync_.rank()], count_, dtype_ == DType::kF32 ? "f32" : "bf16", offset_);
    }
  }
  void reduce() {
    const int n = sync_.size(), me = sync_.rank();
    const std::size_t per = round_up((count_ + n - 1) / n, kLine / esize_);
    const std::size_t lo = std::min(count_, per * static_cast<std::size_t>(me)), hi = std::min(count_, lo + per);
    if (hi == lo) return;
    const std::size_t at = offset_ + lo * esize_, len = hi - lo;
    for (int r = 0; r < n; ++r) srcs_[static_cast<std::size_t>(r)] = w_.region(r) + at;
    std::byte* own = w_.region(me) + at;
    if (n == 2) {
      // One pass writes both regions (sum_into allows dst and dst2 to be sources at the same index).
      sum_into(dtype_, srcs_.data(), n, own, len, w_.region(1 - me) + at);
      return;
    }
    sum_into(dtype_, srcs_.data(), n, own, len);
    for (int r = 0; r < n; ++r)
      if (r != me) std::memcpy(w_.region(r) + at, own, len * esize_);
  }

  ShmWindow& w_;
  std::size_t offset_, count_;
  DType dtype_;
  std::size_t esize_;
  std::uint64_t seq_ = 0;
  bool reduced_ = false, done_ = false;
  std::vector<const void*> srcs_;
};

}  // namespace

ShmWindows::ShmWindows(Group& group, ShmSync& sync, std::string prefix)
    : group_(group), sync_(sync), prefix_(std::move(prefix)) {}

ShmWindows::~ShmWindows() = default;

ShmWindow* ShmWindows::find(const void* data, std::size_t bytes, std::size_t& offset) const {
  const auto* p = static_cast<const std::byte*>(data);
  for (const auto& w : windows_) {
    const std::byte* base = w->region(sync_.rank());
    if (p >= base && p <= base + w->bytes && bytes <= static_cast<std::size_t>(base + w->bytes - p)) {
      offset = static_cast<std::size_t>(p - base);
      return w.get();
    }
  }
  return nullptr;
}

RequestPtr ShmWindows::all_reduce_async(void* data, std::size_t count, DType dtype) {
  std::size_t offset = 0;
  ShmWindow* w = find(data, count * dtype_size(dtype), offset);
  if (w == nullptr) return nullptr;
  auto op = std::make_unique<WindowOp>(sync_, *w, offset, count, dtype);
  op->test();  // the peers may already be there: reduce my chunk before the caller computes
  return op;
}

namespace {

// Runs `fn`, keeping its error for the agreement that follows instead of throwing it alone.
template <typename Fn>
void keep_error(std::string& error, Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    error = e.what();
  }
}

// A member's mapping of the window segment `name`, checked against the header it asked for.
std::unique_ptr<ShmSegment> open_window(const char* name, const WindowHeader& want, std::size_t total, int leader) {
  if (name[0] == '\0') throw_error(ErrorCode::kPeerFailed, "world rank {} could not create it", leader);
  auto seg = ShmSegment::open(name, total);
  const auto* h = reinterpret_cast<const WindowHeader*>(seg->base());
  if (h->magic != want.magic || h->size != want.size || h->bytes != want.bytes || h->stride != want.stride)
    throw_error(ErrorCode::kInvalidArgument,
                "segment {} holds {} bytes per member for {} members, this rank asked for {}: every member "
                "must call allocate_window with the same size",
                name, h->bytes, h->size, want.bytes);
  return seg;
}

}  // namespace

// The leader creates the segment and broadcasts its name through the group itself, the
// others map it, and an all-gather of one status byte tells everybody whether all of them
// did (then the leader unlinks the name, as for the group's own segment).
std::span<std::byte> ShmWindows::allocate(std::size_t bytes) {
  const std::string who = sync_.who();
  if (bytes == 0) throw_error(ErrorCode::kInvalidArgument, "{}: a registered window needs at least one byte", who);
  const std::vector<int>& members = sync_.members();
  const WindowHeader want{kWindowMagic, members.size(), bytes, round_up(bytes, kPage)};
  const std::size_t head = round_up(sizeof(WindowHeader) + members.size() * sizeof(WindowLine), kPage);
  const std::size_t total = head + members.size() * want.stride;
  char name[128] = {};  // empty: the leader could not create it
  std::unique_ptr<ShmSegment> seg;
  std::string error;
  if (sync_.rank() == 0) {
    keep_error(error, [&] {
      seg = ShmSegment::create(fmt::format("{}-w{}", prefix_, windows_.size()), total);
      new (seg->base()) WindowHeader{want};
      std::snprintf(name, sizeof(name), "%s", seg->name().c_str());
    });
  }
  group_.broadcast(name, sizeof(name), 0);
  if (sync_.rank() != 0) keep_error(error, [&] { seg = open_window(name, want, total, members[0]); });
  const std::uint8_t failed = error.empty() ? 0 : 1;
  std::vector<std::uint8_t> all(members.size());
  group_.all_gather(&failed, all.data(), 1);
  if (seg) seg->unlink();
  if (!error.empty()) throw_error(ErrorCode::kIo, "{}: registering a window of {} bytes: {}", who, bytes, error);
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] != 0)
      throw_error(ErrorCode::kPeerFailed, "{}: world rank {} could not register the window of {} bytes (see its log)",
                  who, members[r], bytes);
  auto w = std::make_unique<ShmWindow>();
  w->lines = reinterpret_cast<WindowLine*>(seg->base() + sizeof(WindowHeader));
  w->regions = seg->base() + head;
  w->bytes = bytes;
  w->stride = want.stride;
  w->seg = std::move(seg);
  windows_.push_back(std::move(w));
  return {windows_.back()->region(sync_.rank()), bytes};
}

}  // namespace trellis::transport::detail::shm
