// GgufReader: CheckpointReader over a parsed GgufFile, in Hugging Face names and layouts.
#include "trellis/runtime/checkpoint/gguf_reader.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#include "checkpoint/convert.hpp"
#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/gguf_quant.hpp"

namespace trellis::runtime {
namespace {

struct Entry {
  const gguf::TensorEntry* stored = nullptr;
  std::int64_t rope_heads = 0;  // > 0: Q/K rows are stored in llama.cpp's rotary order
};

class GgufReader final : public CheckpointReader {
 public:
  explicit GgufReader(const std::filesystem::path& path) : file_(gguf::GgufFile::open(path)) { index(); }

  std::string describe() const override { return file_->name(); }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }

  const TensorInfo* find(std::string_view name) const override {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &infos_[it->second];
  }

  std::optional<std::string> config_json() const override { return gguf::config_json_from_metadata(*file_); }

  void read_slice(std::string_view name, const Slice& s, ElemType out_type, void* dst) const override;
  void read_slice_raw(std::string_view name, const Slice& s, void* dst) const override;
  std::span<const std::byte> stored_bytes(std::string_view name) const override {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) throw_error(ErrorCode::kNotFound, "{}: no tensor '{}'", file_->name(), name);
    return file_->tensor_bytes(*entries_[it->second].stored);
  }

 private:
  std::shared_ptr<const gguf::GgufFile> file_;
  std::vector<TensorInfo> infos_;
  std::vector<Entry> entries_;  // parallel to infos_
  std::map<std::string, std::size_t, std::less<>> by_name_;

  void index();
  // The entry of `name` after checking `s` lies inside it; throws naming file and tensor.
  std::size_t checked(std::string_view name, const Slice& s) const;
  std::int64_t heads_for(const std::string& hf_name, const gguf::TensorEntry& t) const;
};

std::int64_t meta_int(const gguf::GgufFile& f, const std::string& key, std::int64_t fallback) {
  const gguf::Value* v = f.find(key);
  return v == nullptr ? fallback : v->as_int(f.name() + ": " + key);
}

std::string arch_of(const gguf::GgufFile& f) {
  const gguf::Value* v = f.find("general.architecture");
  return v == nullptr ? "llama" : v->as_string(f.name() + ": general.architecture");
}

std::int64_t GgufReader::heads_for(const std::string& hf_name, const gguf::TensorEntry& t) const {
  // Only llama.cpp's "llama" converter permutes; qwen2 and others keep HF's row order.
  if (arch_of(*file_) != "llama" || t.ne.size() != 2) return 0;
  const bool is_q = hf_name.ends_with("self_attn.q_proj.weight");
  const bool is_k = hf_name.ends_with("self_attn.k_proj.weight");
  if (!is_q && !is_k) return 0;
  const std::string arch = arch_of(*file_);
  const std::int64_t n_head = meta_int(*file_, arch + ".attention.head_count", 0);
  const std::int64_t heads = is_q ? n_head : meta_int(*file_, arch + ".attention.head_count_kv", n_head);
  if (heads <= 0 || t.rows() % (2 * heads) != 0)
    throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}': {} rows do not split into {} rotary heads",
                file_->name(), t.name, t.rows(), heads);
  return heads;
}

void GgufReader::index() {
  std::vector<std::pair<std::string, const gguf::TensorEntry*>> named;
  for (const gguf::TensorEntry& t : file_->tensors())
    named.emplace_back(gguf::hf_name_from_gguf(t.name).value_or(t.name), &t);
  std::sort(named.begin(), named.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [hf, t] : named) {
    TensorInfo info;
    info.name = hf;
    info.dtype = std::string(gguf::type_traits(t->type).name);
    info.shape.assign(t->ne.rbegin(), t->ne.rend());
    info.file = file_->name();
    if (!by_name_.emplace(hf, infos_.size()).second)
      throw_error(ErrorCode::kCorruptInput, "{}: tensors '{}' and another both map to '{}'", file_->name(),
                  t->name, hf);
    entries_.push_back({t, heads_for(hf, *t)});
    infos_.push_back(std::move(info));
  }
}

std::size_t GgufReader::checked(std::string_view name, const Slice& s) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end())
    throw_error(ErrorCode::kNotFound, "{}: no tensor '{}'", file_->name(), name);
  const TensorInfo& info = infos_[it->second];
  if (s.row_begin < 0 || s.row_end > info.rows() || s.row_begin > s.row_end || s.col_begin < 0 ||
      s.col_end > info.cols() || s.col_begin > s.col_end)
    throw_error(ErrorCode::kInvalidArgument, "{}: tensor '{}' ({}): slice rows [{}, {}) cols [{}, {}) outside {}x{}",
                file_->name(), name, entries_[it->second].stored->name, s.row_begin, s.row_end, s.col_begin,
                s.col_end, info.rows(), info.cols());
  return it->second;
}

void GgufReader::read_slice_raw(std::string_view name, const Slice& s, void* dst) const {
  const Entry& e = entries_[checked(name, s)];
  const gguf::TensorEntry& t = *e.stored;
  const gguf::TypeTraits& tr = gguf::type_traits(t.type);
  if (tr.block_elems == 1)
    throw_error(ErrorCode::kUnsupported, "{}: tensor '{}' ({}) is stored as {}, not a block-quantised type",
                file_->name(), name, t.name, tr.name);
  if (s.col_begin % tr.block_elems != 0 || s.col_end % tr.block_elems != 0)
    throw_error(ErrorCode::kInvalidArgument, "{}: tensor '{}' ({}): columns [{}, {}) are not on {}'s {}-element blocks",
                file_->name(), name, t.name, s.col_begin, s.col_end, tr.name, tr.block_elems);
  const std::span<const std::byte> data = file_->tensor_bytes(t);
  const std::uint64_t row_bytes = t.row_bytes();
  const std::size_t out_row = static_cast<std::size_t>(s.cols() / tr.block_elems * tr.block_bytes);
  const std::uint64_t skip = static_cast<std::uint64_t>(s.col_begin / tr.block_elems * tr.block_bytes);
  auto* out = static_cast<std::byte*>(dst);
  for (std::int64_t r = s.row_begin; r < s.row_end; ++r) {
    // Whole rows move when the rotary reordering is undone, so blocks copy unchanged.
    const std::int64_t stored = e.rope_heads > 0 ? gguf::hf_row_to_gguf(r, t.rows(), e.rope_heads) : r;
    std::memcpy(out + static_cast<std::size_t>(r - s.row_begin) * out_row,
                data.data() + static_cast<std::uint64_t>(stored) * row_bytes + skip, out_row);
  }
}

void GgufReader::read_slice(std::string_view name, const Slice& s, ElemType out_type, void* dst) const {
  const std::size_t index = checked(name, s);
  const Entry& e = entries_[index];
  const gguf::TensorEntry& t = *e.stored;
  const gguf::TypeTraits& tr = gguf::type_traits(t.type);
  if (!tr.dequantizable)
    throw_error(ErrorCode::kUnsupported, "{}: tensor '{}' ({}): stored type {} cannot be converted by trellis",
                file_->name(), name, t.name, tr.name);
  if (s.rows() == 0 || s.cols() == 0) return;

  const std::int64_t b0 = s.col_begin / tr.block_elems;
  const std::int64_t b1 = (s.col_end + tr.block_elems - 1) / tr.block_elems;
  const std::int64_t skip = s.col_begin - b0 * tr.block_elems;
  const std::span<const std::byte> data = file_->tensor_bytes(t);
  const std::uint64_t row_bytes = t.row_bytes();
  std::vector<float> row(static_cast<std::size_t>((b1 - b0) * tr.block_elems));
  const std::size_t out_row_bytes = static_cast<std::size_t>(s.cols()) * elem_size(out_type);
  auto* out = static_cast<std::byte*>(dst);
  for (std::int64_t r = s.row_begin; r < s.row_end; ++r) {
    const std::int64_t stored = e.rope_heads > 0 ? gguf::hf_row_to_gguf(r, t.rows(), e.rope_heads) : r;
    const std::byte* src = data.data() + static_cast<std::uint64_t>(stored) * row_bytes +
                           static_cast<std::uint64_t>(b0 * tr.block_bytes);
    gguf::dequantize_blocks(t.type, src, b1 - b0, row.data());
    std::byte* o = out + static_cast<std::size_t>(r - s.row_begin) * out_row_bytes;
    if (out_type == ElemType::kF32) {
      std::memcpy(o, row.data() + skip, out_row_bytes);
    } else {
      for (std::int64_t c = 0; c < s.cols(); ++c) {
        std::uint16_t b = convert::f32_to_bf16(row[static_cast<std::size_t>(skip + c)]);
        std::memcpy(o + 2 * c, &b, 2);
      }
    }
  }
}

}  // namespace

std::unique_ptr<CheckpointReader> open_gguf(const std::filesystem::path& path) {
  return std::make_unique<GgufReader>(path);
}

}  // namespace trellis::runtime
