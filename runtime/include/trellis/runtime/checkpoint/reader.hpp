// CheckpointReader: the one interface the model loads weights through, whatever the file
// format (safetensors single file or sharded, GGUF). A reader lists the tensors of a
// checkpoint and reads a rectangular slice of one of them, converted to f32 or bf16,
// straight from the memory-mapped file into the caller's buffer. A tensor-parallel rank
// asks only for the rows or columns it owns, so no rank ever materialises a full matrix
// it does not own (the vLLM weight-loader rule of the tensor-parallelism primer).
//
// Conventions every implementation follows, so the model code is format-blind:
//  * Names and layouts are Hugging Face's Llama names and layouts:
//      model.embed_tokens.weight [vocab, hidden], model.norm.weight [hidden],
//      lm_head.weight [vocab, hidden] (absent when tied),
//      model.layers.N.input_layernorm.weight, model.layers.N.post_attention_layernorm.weight,
//      model.layers.N.self_attn.{q,k,v,o}_proj.weight [out, in] (+ .bias for Qwen2 q/k/v),
//      model.layers.N.mlp.{gate,up,down}_proj.weight [out, in].
//    A reader whose format stores other names or layouts (GGUF's blk.N.attn_q and its
//    rotary row permutation of Q and K) maps them back before answering.
//  * A tensor is viewed as 2-D: rows = product of all dimensions but the last, cols = the
//    last dimension; a 1-D tensor of n elements is 1 x n.
//  * Every error is a trellis::Error whose message names the file path and the tensor:
//    kNotFound for a missing tensor or file, kCorruptInput for inconsistent contents,
//    kInvalidArgument for an out-of-range slice request, kUnsupported for a stored type
//    the reader cannot convert. Implementations never read outside the mapped file.
//
// Ownership and threading: a reader owns its mappings and file handles until destroyed.
// After construction it is immutable; read_slice may be called from several threads at
// once on different destinations.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace trellis::runtime {

// Element types a slice can be converted into (what the kernels compute with).
enum class ElemType { kF32, kBF16 };
std::size_t elem_size(ElemType t);
std::string_view to_string(ElemType t);

struct TensorInfo {
  std::string name;
  // The stored type as the format spells it: "F32", "BF16", "F16" for safetensors;
  // GGUF readers use the ggml type name ("F32", "F16", "Q4_1", ...).
  std::string dtype;
  std::vector<std::int64_t> shape;
  // The file that holds the tensor (for messages; a sharded checkpoint has several).
  std::string file;

  std::int64_t rows() const;  // product of all dimensions but the last (1 for 1-D)
  std::int64_t cols() const;  // the last dimension
  std::int64_t numel() const;
};

// A rectangle of the 2-D view: rows [row_begin, row_end) x cols [col_begin, col_end).
struct Slice {
  std::int64_t row_begin = 0, row_end = 0;
  std::int64_t col_begin = 0, col_end = 0;

  std::int64_t rows() const { return row_end - row_begin; }
  std::int64_t cols() const { return col_end - col_begin; }
  // The whole tensor.
  static Slice all(const TensorInfo& t) { return {0, t.rows(), 0, t.cols()}; }
};

class CheckpointReader {
 public:
  virtual ~CheckpointReader() = default;

  // Where the checkpoint came from, for messages: a directory or file path.
  virtual std::string describe() const = 0;

  // All tensors, in a stable order (sorted by name).
  virtual const std::vector<TensorInfo>& tensors() const = 0;

  // The tensor named `name`, or nullptr.
  virtual const TensorInfo* find(std::string_view name) const = 0;

  // Converts `slice` of tensor `name` to `out_type` and writes it densely, row-major,
  // into `dst` (slice.rows() * slice.cols() * elem_size(out_type) bytes, owned by the
  // caller). Only the bytes of the requested rows are touched in the mapping.
  // Throws kNotFound (no such tensor) or kInvalidArgument (slice outside the shape),
  // each naming the file and the tensor.
  virtual void read_slice(std::string_view name, const Slice& slice, ElemType out_type,
                          void* dst) const = 0;

  // Copies `slice` of a tensor stored in a block-quantised type (TensorInfo::dtype "Q4_1",
  // "Q8_0", ...) without converting it: slice.rows() rows of slice.cols() / block elements
  // blocks each, densely into `dst`, in the stored block format. The slice's columns must
  // start and end on block boundaries. Lets the model keep a GGUF file's quantised weights
  // for kernels that multiply them directly. Throws kUnsupported (plain stored type, or a
  // format without block types: the default) or kInvalidArgument (slice outside the shape or
  // not on block boundaries), naming the file and the tensor.
  virtual void read_slice_raw(std::string_view name, const Slice& slice, void* dst) const;

  // The bytes tensor `name` occupies in its file, exactly as stored (no conversion, GGUF's
  // row order), for integrity checks (checkpoint/manifest.hpp). Valid while the reader
  // lives. Throws kNotFound, or kUnsupported for a reader without a file (the default).
  virtual std::span<const std::byte> stored_bytes(std::string_view name) const;

  // The model's configuration as Hugging Face config.json text (the safetensors readers
  // return the config.json beside the weights; a GGUF reader synthesises one from its
  // metadata with the same field names), or nullopt when the checkpoint has none.
  virtual std::optional<std::string> config_json() const = 0;

  // Convenience: find() or throw kNotFound naming describe() and `name`.
  const TensorInfo& require(std::string_view name) const;
};

// Opens a checkpoint by looking at `path`:
//  * a directory with model.safetensors.index.json -> sharded safetensors;
//  * a directory with model.safetensors             -> single-file safetensors;
//  * a *.safetensors file                            -> that file (config.json beside it);
//  * a directory with one *.gguf, or a *.gguf file   -> the GGUF reader, when built.
// Throws kNotFound naming `path` when none applies.
//
// For the GGUF reader: open_checkpoint (runtime/checkpoint/open.cpp) includes
// "trellis/runtime/checkpoint/gguf_reader.hpp" when that header exists and calls
//   std::unique_ptr<CheckpointReader> open_gguf(const std::filesystem::path& file);
// declared there in namespace trellis::runtime, so adding the GGUF sources to
// runtime/CMakeLists.txt is all it takes to plug it in.
std::unique_ptr<CheckpointReader> open_checkpoint(const std::filesystem::path& path);

}  // namespace trellis::runtime
