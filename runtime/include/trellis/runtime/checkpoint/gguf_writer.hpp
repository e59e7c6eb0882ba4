// Writing GGUF files: GgufWriter is the format-level writer (metadata + tensors of any type
// trellis can quantise); write_llama_gguf turns a Hugging Face-named Llama checkpoint into a
// GGUF file llama.cpp can load (names, reversed shapes, Q/K rotary row order, llama.* keys),
// for `trellis make-model --format gguf` and for tests that need files with known contents.
//
// Tensor data is produced one tensor at a time by a caller's callback and streamed to disk,
// so writing a large synthetic model needs memory for one tensor, not the model.
//
// Threading: a writer is used by one thread. Errors: kIo naming the path when the file
// cannot be written; kInvalidArgument for a shape the type cannot hold (a row that is not
// whole blocks) naming the tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "trellis/runtime/checkpoint/gguf.hpp"
#include "trellis/runtime/checkpoint/reader.hpp"

namespace trellis::runtime::gguf {

class GgufWriter {
 public:
  explicit GgufWriter(std::uint64_t alignment = 32);

  // Adds or replaces a metadata key (file order = first insertion order).
  void set(const std::string& key, Value v);
  // Declares a tensor with ggml dimensions (ne[0] fastest) stored as `type`.
  void add_tensor(std::string name, GgmlType type, std::vector<std::int64_t> ne);

  const std::vector<TensorEntry>& tensors() const { return tensors_; }

  // Fills `dst` (numel floats, ggml order) with the values of tensor `t`.
  using Fill = std::function<void(const TensorEntry& t, float* dst)>;
  // Writes the file: header, metadata, tensor table, then every tensor's data from `fill`,
  // quantised to its declared type. Returns the number of bytes written.
  std::uint64_t write(const std::filesystem::path& path, const Fill& fill) const;

 private:
  std::uint64_t alignment_;
  std::vector<std::pair<std::string, Value>> kv_;
  std::vector<TensorEntry> tensors_;
  std::uint64_t data_bytes_ = 0;
};

// Writes a Llama checkpoint given in Hugging Face names and shapes (see reader.hpp) as GGUF.
//  * config_json: the Hugging Face config.json text (hidden_size, num_attention_heads, ...),
//    mapped to llama.* keys (qwen2.* and no Q/K row reordering for model_type qwen2; the
//    full rope_scaling object is kept in trellis.rope_scaling, since llama.cpp's keys cover
//    only linear and yarn);
//  * tensors: names and HF shapes ([out, in]); fill(info, dst) writes the HF-layout values
//    (rows x cols floats) of one tensor;
//  * weight_type: the type of 2-D weights (F32, F16, BF16, Q8_0, Q4_0 or Q4_1); 1-D tensors
//    are F32, and a 2-D tensor whose rows are not whole blocks falls back to F32.
//  * extra: further metadata (a tokenizer's tokenizer.ggml.* keys, general.name, ...).
// Q and K rows are written in llama.cpp's rotary order, so llama.cpp and open_gguf both read
// back what fill produced.
void write_llama_gguf(const std::filesystem::path& path, const std::string& config_json,
                      const std::vector<TensorInfo>& tensors,
                      const std::function<void(const TensorInfo&, float* dst)>& fill, GgmlType weight_type,
                      const std::vector<std::pair<std::string, Value>>& extra = {});

}  // namespace trellis::runtime::gguf
