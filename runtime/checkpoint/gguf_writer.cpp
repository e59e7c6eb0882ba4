// GGUF writing: the header and tensor table are laid out in memory first (they are small),
// then tensor data is streamed one tensor at a time, each padded to the alignment.
#include "trellis/runtime/checkpoint/gguf_writer.hpp"

#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/gguf_quant.hpp"
#include "trellis/runtime/checkpoint/gguf_reader.hpp"

namespace trellis::runtime::gguf {
namespace {

class Bytes {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const std::byte*>(&v);
    b_.insert(b_.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<std::uint64_t>(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    b_.insert(b_.end(), p, p + s.size());
  }
  void put_value(const Value& v) {
    switch (v.type) {
      case ValueType::kU8: case ValueType::kBool: put<std::uint8_t>(static_cast<std::uint8_t>(v.u)); break;
      case ValueType::kU16: put<std::uint16_t>(static_cast<std::uint16_t>(v.u)); break;
      case ValueType::kU32: put<std::uint32_t>(static_cast<std::uint32_t>(v.u)); break;
      case ValueType::kU64: put<std::uint64_t>(v.u); break;
      case ValueType::kI8: put<std::int8_t>(static_cast<std::int8_t>(v.i)); break;
      case ValueType::kI16: put<std::int16_t>(static_cast<std::int16_t>(v.i)); break;
      case ValueType::kI32: put<std::int32_t>(static_cast<std::int32_t>(v.i)); break;
      case ValueType::kI64: put<std::int64_t>(v.i); break;
      case ValueType::kF32: put<float>(static_cast<float>(v.f)); break;
      case ValueType::kF64: put<double>(v.f); break;
      case ValueType::kString: put_string(v.s); break;
      case ValueType::kArray:
        put<std::uint32_t>(static_cast<std::uint32_t>(v.elem_type));
        put<std::uint64_t>(v.items.size());
        for (const Value& item : v.items) put_value(item);
        break;
    }
  }
  void pad_to(std::uint64_t alignment) {
    while (b_.size() % alignment != 0) b_.push_back(std::byte{0});
  }
  const std::vector<std::byte>& bytes() const { return b_; }

 private:
  std::vector<std::byte> b_;
};

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

GgufWriter::GgufWriter(std::uint64_t alignment) : alignment_(alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0)
    throw_error(ErrorCode::kInvalidArgument, "GGUF alignment {} is not a power of two", alignment);
  if (alignment != 32) set("general.alignment", Value::of_u32(static_cast<std::uint32_t>(alignment)));
}

void GgufWriter::set(const std::string& key, Value v) {
  for (auto& [k, old] : kv_)
    if (k == key) {
      old = std::move(v);
      return;
    }
  kv_.emplace_back(key, std::move(v));
}

void GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<std::int64_t> ne) {
  const TypeTraits& tr = type_traits(type);
  if (ne.empty() || ne[0] % tr.block_elems != 0)
    throw_error(ErrorCode::kInvalidArgument, "GGUF tensor '{}': rows of {} elements are not whole {} blocks", name,
                ne.empty() ? 0 : ne[0], tr.name);
  TensorEntry t;
  t.name = std::move(name);
  t.type = type;
  t.ne = std::move(ne);
  t.offset = data_bytes_;
  t.nbytes = static_cast<std::uint64_t>(t.numel() / tr.block_elems * tr.block_bytes);
  data_bytes_ = align_up(data_bytes_ + t.nbytes, alignment_);
  tensors_.push_back(std::move(t));
}

std::uint64_t GgufWriter::write(const std::filesystem::path& path, const Fill& fill) const {
  Bytes h;
  h.put<std::uint32_t>(0x46554747u);  // "GGUF" little-endian
  h.put<std::uint32_t>(3);
  h.put<std::uint64_t>(tensors_.size());
  h.put<std::uint64_t>(kv_.size());
  for (const auto& [key, v] : kv_) {
    h.put_string(key);
    h.put<std::uint32_t>(static_cast<std::uint32_t>(v.type));
    h.put_value(v);
  }
  for (const TensorEntry& t : tensors_) {
    h.put_string(t.name);
    h.put<std::uint32_t>(static_cast<std::uint32_t>(t.ne.size()));
    for (auto d : t.ne) h.put<std::uint64_t>(static_cast<std::uint64_t>(d));
    h.put<std::uint32_t>(static_cast<std::uint32_t>(t.type));
    h.put<std::uint64_t>(t.offset);
  }
  h.pad_to(alignment_);

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw_error(ErrorCode::kIo, "{}: cannot open for writing", path.string());
  out.write(reinterpret_cast<const char*>(h.bytes().data()), static_cast<std::streamsize>(h.bytes().size()));
  std::vector<float> values;
  std::vector<std::byte> packed;
  std::uint64_t pos = 0;
  for (const TensorEntry& t : tensors_) {
    values.assign(static_cast<std::size_t>(t.numel()), 0.0f);
    fill(t, values.data());
    packed.assign(align_up(t.nbytes, alignment_), std::byte{0});
    quantize(t.type, values.data(), t.numel(), packed.data());
    out.seekp(static_cast<std::streamoff>(h.bytes().size() + t.offset));
    out.write(reinterpret_cast<const char*>(packed.data()), static_cast<std::streamsize>(packed.size()));
    pos = t.offset + packed.size();
  }
  out.flush();
  if (!out) throw_error(ErrorCode::kIo, "{}: write failed", path.string());
  return h.bytes().size() + pos;
}

void write_llama_gguf(const std::filesystem::path& path, const std::string& config_json,
                      const std::vector<TensorInfo>& tensors,
                      const std::function<void(const TensorInfo&, float* dst)>& fill, GgmlType weight_type,
                      const std::vector<std::pair<std::string, Value>>& extra) {
  if (weight_type != GgmlType::kF32 && weight_type != GgmlType::kF16 && weight_type != GgmlType::kBF16 &&
      weight_type != GgmlType::kQ8_0 && weight_type != GgmlType::kQ4_0 && weight_type != GgmlType::kQ4_1)
    throw_error(ErrorCode::kInvalidArgument, "{}: trellis writes GGUF weights as F32, F16, BF16, Q8_0, Q4_0 or Q4_1, not {}",
                path.string(), type_traits(weight_type).name);
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(config_json);
  } catch (const std::exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "{}: config.json does not parse: {}", path.string(), e.what());
  }
  auto num = [&](const char* k) -> std::int64_t {
    if (!c.contains(k)) throw_error(ErrorCode::kInvalidArgument, "{}: config has no '{}'", path.string(), k);
    return c.at(k).get<std::int64_t>();
  };
  const std::int64_t hidden = num("hidden_size"), heads = num("num_attention_heads");
  const std::int64_t kv_heads = c.value("num_key_value_heads", heads);
  const std::int64_t head_dim = c.value("head_dim", hidden / heads);

  // Qwen2 has its own llama.cpp architecture (same keys, no rotary row permutation);
  // Llama, Mistral and the rest are "llama".
  const std::string arch = c.value("model_type", std::string("llama")) == "qwen2" ? "qwen2" : "llama";
  const bool permute = arch == "llama";
  auto key = [&](const char* k) { return arch + "." + k; };
  GgufWriter w;
  w.set("general.architecture", Value::of_string(arch));
  w.set("general.name", Value::of_string(c.value("_name_or_path", std::string("trellis synthetic"))));
  w.set(key("block_count"), Value::of_u32(static_cast<std::uint32_t>(num("num_hidden_layers"))));
  w.set(key("context_length"), Value::of_u32(static_cast<std::uint32_t>(c.value("max_position_embeddings", 2048))));
  w.set(key("embedding_length"), Value::of_u32(static_cast<std::uint32_t>(hidden)));
  w.set(key("feed_forward_length"), Value::of_u32(static_cast<std::uint32_t>(num("intermediate_size"))));
  w.set(key("attention.head_count"), Value::of_u32(static_cast<std::uint32_t>(heads)));
  w.set(key("attention.head_count_kv"), Value::of_u32(static_cast<std::uint32_t>(kv_heads)));
  w.set(key("rope.freq_base"), Value::of_f32(c.value("rope_theta", 10000.0f)));
  w.set(key("attention.layer_norm_rms_epsilon"), Value::of_f32(c.value("rms_norm_eps", 1e-5f)));
  w.set(key("rope.dimension_count"), Value::of_u32(static_cast<std::uint32_t>(head_dim)));
  w.set(key("attention.key_length"), Value::of_u32(static_cast<std::uint32_t>(head_dim)));
  w.set(key("attention.value_length"), Value::of_u32(static_cast<std::uint32_t>(head_dim)));
  w.set(key("vocab_size"), Value::of_u32(static_cast<std::uint32_t>(num("vocab_size"))));
  if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) {
    const auto& rs = c["rope_scaling"];
    const std::string type = rs.value("rope_type", rs.value("type", std::string("none")));
    // llama.cpp's keys describe linear and yarn scaling only (it takes Llama 3's as a
    // rope_freqs tensor); the full Hugging Face object travels in a trellis key so that
    // trellis reads back exactly what it wrote.
    w.set("trellis.rope_scaling", Value::of_string(rs.dump()));
    if (type == "linear" || type == "yarn") {
      w.set(key("rope.scaling.type"), Value::of_string(type));
      if (rs.contains("factor")) w.set(key("rope.scaling.factor"), Value::of_f32(rs["factor"].get<float>()));
      if (rs.contains("original_max_position_embeddings"))
        w.set(key("rope.scaling.original_context_length"),
              Value::of_u32(rs["original_max_position_embeddings"].get<std::uint32_t>()));
    }
  }
  for (const auto& [k, v] : extra) w.set(k, v);

  std::map<std::string, std::pair<const TensorInfo*, std::int64_t>> by_gguf;  // -> (HF info, rotary heads)
  for (const TensorInfo& t : tensors) {
    std::string name = gguf_name_from_hf(t.name).value_or(t.name);
    std::int64_t rope_heads = 0;
    if (permute && t.name.ends_with("self_attn.q_proj.weight")) rope_heads = heads;
    if (permute && t.name.ends_with("self_attn.k_proj.weight")) rope_heads = kv_heads;
    const GgmlType type = t.shape.size() >= 2 && t.cols() % type_traits(weight_type).block_elems == 0
                              ? weight_type : GgmlType::kF32;
    w.add_tensor(name, type, std::vector<std::int64_t>(t.shape.rbegin(), t.shape.rend()));
    by_gguf[name] = {&t, rope_heads};
  }
  std::vector<float> hf;
  w.write(path, [&](const TensorEntry& e, float* dst) {
    const auto& [info, rope_heads] = by_gguf.at(e.name);
    if (rope_heads == 0) return fill(*info, dst);
    hf.resize(static_cast<std::size_t>(info->numel()));
    fill(*info, hf.data());
    const std::int64_t rows = info->rows(), cols = info->cols();
    for (std::int64_t g = 0; g < rows; ++g)
      std::memcpy(dst + g * cols, hf.data() + gguf_row_to_hf(g, rows, rope_heads) * cols,
                  static_cast<std::size_t>(cols) * sizeof(float));
  });
}

}  // namespace trellis::runtime::gguf
