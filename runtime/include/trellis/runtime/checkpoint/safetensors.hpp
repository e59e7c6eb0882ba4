// safetensors: the file format Hugging Face checkpoints ship in. A file is an 8-byte
// little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets}},
// then the raw tensor bytes; data_offsets are relative to the end of the header.
// A sharded checkpoint is a directory of such files plus model.safetensors.index.json
// ({"weight_map": {tensor: file}}).
//
// The parser validates everything before any tensor byte is touched: header length
// inside the file, JSON well-formed, dtype known, shape x dtype size == byte range,
// every range inside the data section, no two ranges overlapping. Errors are
// kCorruptInput naming the file and (where one is at fault) the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "trellis/runtime/checkpoint/reader.hpp"

namespace trellis::runtime {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;                 // "F32", "BF16", "F16", "I32", ...
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte range from the start of the file (validated)
};

// Parses and validates the header of a whole safetensors file held in `file` (usually a
// mapping). `file_name` is quoted in errors. Never reads outside `file`.
std::vector<SafetensorsEntry> parse_safetensors(std::span<const std::byte> file,
                                                const std::string& file_name);

// Bytes per element of a safetensors dtype name, or 0 if unknown.
std::size_t safetensors_dtype_size(std::string_view dtype);

// Readers for one file, or a directory (index.json if present, else model.safetensors).
std::unique_ptr<CheckpointReader> open_safetensors_file(const std::filesystem::path& file);
std::unique_ptr<CheckpointReader> open_safetensors_dir(const std::filesystem::path& dir);

// Writing (used by `trellis make-model` and tests).
struct TensorSpec {
  std::string name;
  std::string dtype;  // "F32", "BF16" or "F16"
  std::vector<std::int64_t> shape;
};
// Fills the bytes of tensor `index` (its full size, already allocated).
using TensorFiller = std::function<void(std::size_t index, std::span<std::byte> out)>;

// Writes one safetensors file with `tensors` in order; `fill` is called once per tensor.
void write_safetensors(const std::filesystem::path& file, const std::vector<TensorSpec>& tensors,
                       const TensorFiller& fill);

// Writes `tensors` as shards of at most ~max_shard_bytes each
// (model-0000k-of-0000n.safetensors) plus model.safetensors.index.json in `dir`; a
// single shard is written as model.safetensors with no index. Returns the files written.
std::vector<std::filesystem::path> write_safetensors_sharded(
    const std::filesystem::path& dir, const std::vector<TensorSpec>& tensors,
    const TensorFiller& fill, std::uint64_t max_shard_bytes);

}  // namespace trellis::runtime
