#include "trellis/runtime/scheduler/schedule.hpp"

#include <cstring>

#include "trellis/core/error.hpp"

namespace trellis::runtime {
namespace {

constexpr std::uint32_t kMagic = 0x4f535254;  // "TRSO"
// Version 2: the prompt bit (chunked prefill). Version 3: SWIFT's candidates, trees, skip
// sets and KV moves.
constexpr std::uint16_t kVersion = 3;
constexpr std::uint8_t kSample = 1, kFirst = 2, kPrompt = 4, kCandidates = 8, kTree = 16,
                       kKnownBits = kSample | kFirst | kPrompt | kCandidates | kTree;

struct Writer {
  std::vector<std::byte>& out;
  template <typename T>
  void put(T v) {
    auto n = out.size();
    out.resize(n + sizeof(T));
    std::memcpy(out.data() + n, &v, sizeof(T));
  }
};

struct Reader {
  std::span<const std::byte> in;
  const char* what;
  std::size_t at = 0;
  template <typename T>
  T get() {
    if (in.size() - at < sizeof(T))
      throw_error(ErrorCode::kCorruptInput, "{}: scheduling output truncated at byte {} of {}", what, at, in.size());
    T v;
    std::memcpy(&v, in.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
};

void put_params(Writer& w, const SamplingParams& p) {
  w.put(p.temperature);
  w.put(static_cast<std::int32_t>(p.top_k));
  w.put(p.top_p);
  w.put(p.min_p);
  w.put(static_cast<std::uint8_t>(p.greedy));
  w.put(p.seed);
  w.put(p.frequency_penalty);
  w.put(p.presence_penalty);
  w.put(p.repetition_penalty);
  w.put(static_cast<std::int32_t>(p.max_tokens));
  w.put(static_cast<std::uint32_t>(p.stop_ids.size()));
  for (auto id : p.stop_ids) w.put(id);
}

SamplingParams get_params(Reader& r) {
  SamplingParams p;
  p.temperature = r.get<float>();
  p.top_k = r.get<std::int32_t>();
  p.top_p = r.get<float>();
  p.min_p = r.get<float>();
  p.greedy = r.get<std::uint8_t>() != 0;
  p.seed = r.get<std::uint64_t>();
  p.frequency_penalty = r.get<float>();
  p.presence_penalty = r.get<float>();
  p.repetition_penalty = r.get<float>();
  p.max_tokens = r.get<std::int32_t>();
  auto n = r.get<std::uint32_t>();
  if (n > (r.in.size() - r.at) / 4)
    throw_error(ErrorCode::kCorruptInput, "{}: scheduling output claims {} stop ids", r.what, n);
  for (std::uint32_t i = 0; i < n; ++i) p.stop_ids.push_back(r.get<std::int32_t>());
  return p;
}

}  // namespace

int ScheduleOutput::n_sampled() const {
  int n = 0;
  for (const auto& s : seqs) n += s.sample ? 1 : 0;
  return n;
}

int ScheduleOutput::logit_rows() const {
  int n = 0;
  for (const auto& s : seqs) n += s.logit_rows();
  return n;
}

void serialize(const ScheduleOutput& s, std::vector<std::byte>& out) {
  out.clear();
  Writer w{out};
  w.put(kMagic);
  w.put(kVersion);
  const std::uint16_t flags =
      static_cast<std::uint16_t>(s.flags | (s.skip.empty() && s.moves.empty() ? 0 : ScheduleOutput::kSwift));
  w.put(flags);
  w.put(s.iteration);
  w.put(static_cast<std::uint32_t>(s.group));
  w.put(static_cast<std::uint32_t>(s.seqs.size()));
  w.put(static_cast<std::uint32_t>(s.tokens.size()));
  for (const auto& q : s.seqs) {
    w.put(q.id);
    w.put(q.slot);
    w.put(q.column);
    w.put(q.pos);
    w.put(q.n_tokens);
    const bool tree = !q.parents.empty();
    w.put(static_cast<std::uint8_t>((q.sample ? kSample : 0) | (q.first ? kFirst : 0) | (q.prompt ? kPrompt : 0) |
                                    (q.candidates ? kCandidates : 0) | (tree ? kTree : 0)));
    if (q.first) put_params(w, q.params);
    if (tree) {
      w.put(q.kv_pos);
      w.put(q.prefix);
      for (auto p : q.parents) w.put(p);
    }
  }
  for (auto t : s.tokens) w.put(t);
  if (flags & ScheduleOutput::kSwift) {
    w.put(static_cast<std::uint32_t>(s.skip.size()));
    for (auto z : s.skip) w.put(z);
    w.put(static_cast<std::uint32_t>(s.moves.size()));
    for (const auto& m : s.moves) {
      w.put(m.slot);
      w.put(m.src);
      w.put(m.dst);
      w.put(m.count);
    }
  }
}

ScheduleOutput deserialize_schedule(std::span<const std::byte> in, const char* what) {
  Reader r{in, what};
  if (r.get<std::uint32_t>() != kMagic)
    throw_error(ErrorCode::kCorruptInput, "{}: not a scheduling output (bad magic)", what);
  if (auto v = r.get<std::uint16_t>(); v != kVersion)
    throw_error(ErrorCode::kCorruptInput, "{}: scheduling output version {} (expected {})", what, v, kVersion);
  ScheduleOutput s;
  s.flags = r.get<std::uint16_t>();
  if ((s.flags & ~ScheduleOutput::kKnownFlags) != 0)
    throw_error(ErrorCode::kCorruptInput, "{}: scheduling output has unknown flags {:#x}", what, s.flags);
  s.iteration = r.get<std::uint64_t>();
  s.group = static_cast<std::int32_t>(r.get<std::uint32_t>());
  auto n_seqs = r.get<std::uint32_t>(), n_tokens = r.get<std::uint32_t>();
  if (n_seqs > in.size() / 25 || n_tokens > in.size() / 4)
    throw_error(ErrorCode::kCorruptInput, "{}: scheduling output claims {} sequences and {} tokens in {} bytes", what,
                n_seqs, n_tokens, in.size());
  s.seqs.resize(n_seqs);
  std::int64_t sum = 0;
  for (auto& q : s.seqs) {
    q.id = r.get<std::int64_t>();
    q.slot = r.get<std::int32_t>();
    q.column = r.get<std::int32_t>();
    q.pos = r.get<std::int32_t>();
    q.n_tokens = r.get<std::int32_t>();
    auto bits = r.get<std::uint8_t>();
    if ((bits & ~kKnownBits) != 0 || ((bits & kFirst) != 0 && (bits & kPrompt) == 0))
      throw_error(ErrorCode::kCorruptInput, "{}: sequence {} has flag bits {:#x} (known: sample 1, first 2, prompt 4; "
                  "first needs prompt)", what, q.id, bits);
    q.sample = (bits & kSample) != 0;
    q.first = (bits & kFirst) != 0;
    q.prompt = (bits & kPrompt) != 0;
    q.candidates = (bits & kCandidates) != 0;
    if (q.first) q.params = get_params(r);
    if (q.n_tokens < 1 || q.pos < 0 || q.slot < 0 || q.column < 0 || q.n_tokens > static_cast<std::int32_t>(n_tokens))
      throw_error(ErrorCode::kCorruptInput, "{}: sequence {} has n_tokens {} pos {} slot {} column {}", what, q.id,
                  q.n_tokens, q.pos, q.slot, q.column);
    if (q.sample && q.candidates)
      throw_error(ErrorCode::kCorruptInput, "{}: sequence {} is both sampled and asked for candidates", what, q.id);
    if (bits & kTree) {
      q.kv_pos = r.get<std::int32_t>();
      q.prefix = r.get<std::int32_t>();
      q.parents.resize(static_cast<std::size_t>(q.n_tokens));
      for (std::int32_t i = 0; i < q.n_tokens; ++i) {
        q.parents[static_cast<std::size_t>(i)] = r.get<std::int32_t>();
        if (q.parents[static_cast<std::size_t>(i)] < -1 || q.parents[static_cast<std::size_t>(i)] >= i)
          throw_error(ErrorCode::kCorruptInput, "{}: sequence {}: tree token {} has parent {}", what, q.id, i,
                      q.parents[static_cast<std::size_t>(i)]);
      }
      if (q.prefix < 0 || q.prefix > q.kv_pos)
        throw_error(ErrorCode::kCorruptInput, "{}: sequence {}: tree prefix {} and K/V start {}", what, q.id, q.prefix,
                    q.kv_pos);
    }
    sum += q.n_tokens;
  }
  if (sum != static_cast<std::int64_t>(n_tokens))
    throw_error(ErrorCode::kCorruptInput, "{}: sequences hold {} tokens, header says {}", what, sum, n_tokens);
  s.tokens.resize(n_tokens);
  for (auto& t : s.tokens) t = r.get<std::int32_t>();
  if (s.flags & ScheduleOutput::kSwift) {
    auto n = r.get<std::uint32_t>();
    if (n > in.size() - r.at)
      throw_error(ErrorCode::kCorruptInput, "{}: scheduling output claims a skip set of {} entries", what, n);
    s.skip.resize(n);
    for (auto& z : s.skip) {
      z = r.get<std::uint8_t>();
      if (z > 1) throw_error(ErrorCode::kCorruptInput, "{}: skip set entry {} is not 0 or 1", what, z);
    }
    auto m = r.get<std::uint32_t>();
    if (m > (in.size() - r.at) / 16)
      throw_error(ErrorCode::kCorruptInput, "{}: scheduling output claims {} KV moves", what, m);
    s.moves.resize(m);
    for (auto& mv : s.moves) {
      mv.slot = r.get<std::int32_t>();
      mv.src = r.get<std::int32_t>();
      mv.dst = r.get<std::int32_t>();
      mv.count = r.get<std::int32_t>();
      if (mv.slot < 0 || mv.src < 0 || mv.dst < 0 || mv.count < 0)
        throw_error(ErrorCode::kCorruptInput, "{}: KV move slot {} {} -> {} x {}", what, mv.slot, mv.src, mv.dst,
                    mv.count);
    }
  }
  if (r.at != in.size())
    throw_error(ErrorCode::kCorruptInput, "{}: {} trailing bytes after the scheduling output", what, in.size() - r.at);
  return s;
}

}  // namespace trellis::runtime
