// ProgressThread (progress.hpp): a background thread that keeps testing outstanding requests.
#include "trellis/transport/progress.hpp"

#include <atomic>
#include <exception>
#include <string>
#include <vector>

namespace trellis::transport {

ProgressOptions ProgressOptions::from_config(const Config& config) {
  ProgressOptions o;
  o.enabled = config.get_bool("comm.progress_thread");
  o.interval = std::chrono::microseconds(config.get_int("comm.progress_interval_us"));
  o.cooperative = config.get_bool("comm.progress_cooperative");
  o.cooperative_interval = std::chrono::microseconds(config.get_int("comm.progress_cooperative_us"));
  return o;
}

struct ProgressThread::Item {
  std::mutex mu;            // held while a thread tests `inner`
  RequestPtr inner;         // null once the owner dropped the request
  std::atomic<bool> done{false};
  std::exception_ptr error;  // written under mu before done is set
  std::size_t bytes = 0;
  std::string what;

  // Tests `inner` once; the caller holds mu. Returns done.
  bool step() {
    if (done.load(std::memory_order_acquire)) return true;
    if (!inner) return true;
    try {
      if (inner->test()) done.store(true, std::memory_order_release);
    } catch (...) {
      error = std::current_exception();
      done.store(true, std::memory_order_release);
    }
    return done.load(std::memory_order_relaxed);
  }
};

namespace {

// What the owner holds: completion is read from the shared item; when the background thread
// is not testing at this moment, the owner tests the request itself (a waiting owner drives
// its own request at full speed).
class DrivenRequest final : public Request {
 public:
  explicit DrivenRequest(std::shared_ptr<ProgressThread::Item> item) : item_(std::move(item)) {}
  ~DrivenRequest() override {
    // Destroying an incomplete request cancels it (request.hpp): do it under the lock so the
    // background thread never tests a destroyed request.
    std::lock_guard lk(item_->mu);
    item_->inner.reset();
    item_->done.store(true, std::memory_order_release);
  }
  bool test() override {
    if (!item_->done.load(std::memory_order_acquire)) {
      std::unique_lock lk(item_->mu, std::try_to_lock);
      if (!lk.owns_lock()) return false;
      if (!item_->step()) return false;
    }
    std::lock_guard lk(item_->mu);  // error was written under mu
    if (item_->error) std::rethrow_exception(item_->error);
    return true;
  }
  std::size_t bytes() const override { return item_->bytes; }
  std::string describe() const override { return item_->what + " (driven by a progress thread)"; }

 private:
  std::shared_ptr<ProgressThread::Item> item_;
};

}  // namespace

ProgressThread::ProgressThread(ProgressOptions options) : opts_(options) {}

ProgressThread::~ProgressThread() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

RequestPtr ProgressThread::drive(RequestPtr r) {
  if ((!opts_.enabled && !opts_.cooperative) || !r) return r;
  auto item = std::make_shared<Item>();
  item->bytes = r->bytes();
  item->what = r->describe();
  item->inner = std::move(r);
  if (opts_.cooperative) {
    std::erase_if(owned_, [](const std::shared_ptr<Item>& it) { return it->done.load(std::memory_order_acquire); });
    owned_.push_back(item);
    next_poll_ = {};  // the first poll after issuing tests at once: a new step may be ready
  }
  if (opts_.enabled) {
    {
      std::lock_guard lk(mu_);
      items_.push_back(item);
      if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_one();
  }
  return std::make_unique<DrivenRequest>(std::move(item));
}

// The owner's thread, from inside its compute. The clock read is the only cost while the
// interval has not passed (the kernels call this every few tens of microseconds). An item the
// background thread is testing right now is skipped: that test moves it just as well.
void ProgressThread::poll() noexcept {
  if (owned_.empty()) return;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_poll_) return;
  next_poll_ = now + opts_.cooperative_interval;
  bool any_done = false;
  for (auto& it : owned_) {
    std::unique_lock ilk(it->mu, std::try_to_lock);
    if (!ilk.owns_lock()) continue;
    any_done |= it->step();
    ++coop_tests_;
  }
  if (any_done)
    std::erase_if(owned_, [](const std::shared_ptr<Item>& it) { return it->done.load(std::memory_order_acquire); });
}

std::uint64_t ProgressThread::background_tests() const {
  std::lock_guard lk(mu_);
  return background_tests_;
}

// Blocks while there is nothing to drive; otherwise tests every outstanding item that the
// owner is not testing right now, then sleeps (or yields) for the interval. Never spins.
void ProgressThread::loop() {
  std::vector<std::shared_ptr<Item>> work;
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [this] { return stop_ || !items_.empty(); });
    if (stop_) return;
    work = items_;
    lk.unlock();
    std::uint64_t tests = 0;
    for (auto& it : work) {
      std::unique_lock ilk(it->mu, std::try_to_lock);
      if (!ilk.owns_lock()) continue;
      it->step();
      ++tests;
    }
    work.clear();
    lk.lock();
    background_tests_ += tests;
    std::erase_if(items_, [](const std::shared_ptr<Item>& it) { return it->done.load(std::memory_order_acquire); });
    if (items_.empty()) continue;
    lk.unlock();
    if (opts_.interval.count() > 0) {
      std::this_thread::sleep_for(opts_.interval);
    } else {
      std::this_thread::yield();
    }
    lk.lock();
  }
}

}  // namespace trellis::transport
