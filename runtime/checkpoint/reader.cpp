#include "trellis/runtime/checkpoint/reader.hpp"

#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/safetensors.hpp"

#if __has_include("trellis/runtime/checkpoint/gguf_reader.hpp")
#include "trellis/runtime/checkpoint/gguf_reader.hpp"
#define TRELLIS_HAVE_GGUF_READER 1
#endif

namespace trellis::runtime {

std::size_t elem_size(ElemType t) { return t == ElemType::kF32 ? 4 : 2; }
std::string_view to_string(ElemType t) { return t == ElemType::kF32 ? "f32" : "bf16"; }

std::int64_t TensorInfo::rows() const {
  std::int64_t r = 1;
  for (std::size_t i = 0; i + 1 < shape.size(); ++i) r *= shape[i];
  return r;
}
std::int64_t TensorInfo::cols() const { return shape.empty() ? 1 : shape.back(); }
std::int64_t TensorInfo::numel() const { return rows() * cols(); }

const TensorInfo& CheckpointReader::require(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) throw_error(ErrorCode::kNotFound, "{}: tensor '{}' is missing from the checkpoint", describe(), name);
  return *t;
}

void CheckpointReader::read_slice_raw(std::string_view name, const Slice&, void*) const {
  const TensorInfo& t = require(name);
  throw_error(ErrorCode::kUnsupported, "{}: tensor '{}' is stored as {}, which has no block-quantised form to copy",
              t.file, name, t.dtype);
}

std::span<const std::byte> CheckpointReader::stored_bytes(std::string_view name) const {
  (void)require(name);
  throw_error(ErrorCode::kUnsupported, "{}: tensor '{}': this checkpoint has no stored bytes to check (it is not read "
              "from a file)", describe(), name);
}

std::unique_ptr<CheckpointReader> open_checkpoint(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  if (!fs::exists(path)) throw_error(ErrorCode::kNotFound, "checkpoint {} does not exist", path.string());
  if (fs::is_directory(path)) {
    if (fs::exists(path / "model.safetensors.index.json") || fs::exists(path / "model.safetensors"))
      return open_safetensors_dir(path);
#ifdef TRELLIS_HAVE_GGUF_READER
    for (const auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ".gguf") return open_gguf(e.path());
#endif
    throw_error(ErrorCode::kNotFound,
                "{}: no model.safetensors.index.json, model.safetensors{} in this directory", path.string(),
#ifdef TRELLIS_HAVE_GGUF_READER
                " or *.gguf"
#else
                ""
#endif
    );
  }
  if (path.extension() == ".safetensors") return open_safetensors_file(path);
#ifdef TRELLIS_HAVE_GGUF_READER
  if (path.extension() == ".gguf") return open_gguf(path);
#endif
  throw_error(ErrorCode::kNotFound, "{}: not a checkpoint directory or a .safetensors{} file", path.string(),
#ifdef TRELLIS_HAVE_GGUF_READER
              "/.gguf"
#else
              ""
#endif
  );
}

}  // namespace trellis::runtime
