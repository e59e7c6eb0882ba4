// safetensors writer: header first (offsets are known from the specs), then each tensor's
// bytes as its filler produces them, so writing a 1B model needs one tensor of memory.
#include <nlohmann/json.hpp>

#include <fstream>

#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/safetensors.hpp"

namespace trellis::runtime {
namespace {

namespace fs = std::filesystem;

std::uint64_t tensor_bytes(const TensorSpec& t) {
  std::uint64_t n = safetensors_dtype_size(t.dtype);
  if (n == 0) throw_error(ErrorCode::kInvalidArgument, "tensor '{}': unknown dtype {}", t.name, t.dtype);
  for (auto d : t.shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

void write_file(const fs::path& file, const std::vector<TensorSpec>& tensors, const std::vector<std::size_t>& which,
                const TensorFiller& fill) {
  nlohmann::json header = nlohmann::json::object();
  std::uint64_t off = 0;
  for (auto i : which) {
    const auto& t = tensors[i];
    std::uint64_t n = tensor_bytes(t);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  if (!out) throw_error(ErrorCode::kIo, "cannot create {}", file.string());
  std::uint64_t n = text.size();
  char len[8];
  for (int b = 0; b < 8; ++b) len[b] = static_cast<char>((n >> (8 * b)) & 0xff);
  out.write(len, 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<std::byte> buf;
  for (auto i : which) {
    buf.assign(tensor_bytes(tensors[i]), std::byte{0});
    fill(i, buf);
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(buf.size()));
  }
  out.flush();
  if (!out) throw_error(ErrorCode::kIo, "writing {} failed (disk full?)", file.string());
}

}  // namespace

void write_safetensors(const fs::path& file, const std::vector<TensorSpec>& tensors, const TensorFiller& fill) {
  std::vector<std::size_t> all(tensors.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  write_file(file, tensors, all, fill);
}

std::vector<fs::path> write_safetensors_sharded(const fs::path& dir, const std::vector<TensorSpec>& tensors,
                                                const TensorFiller& fill, std::uint64_t max_shard_bytes) {
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t cur = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    std::uint64_t n = tensor_bytes(tensors[i]);
    if (cur > 0 && cur + n > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(i);
    cur += n;
  }
  fs::create_directories(dir);
  std::vector<fs::path> written;
  if (shards.size() == 1) {
    write_file(dir / "model.safetensors", tensors, shards[0], fill);
    fs::remove(dir / "model.safetensors.index.json");
    return {dir / "model.safetensors"};
  }
  nlohmann::json index;
  std::uint64_t total = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    write_file(dir / name, tensors, shards[s], fill);
    written.push_back(dir / name);
    for (auto i : shards[s]) {
      index["weight_map"][tensors[i].name] = name;
      total += tensor_bytes(tensors[i]);
    }
  }
  index["metadata"] = {{"total_size", total}};
  std::ofstream out(dir / "model.safetensors.index.json", std::ios::trunc);
  out << index.dump(2) << "\n";
  if (!out) throw_error(ErrorCode::kIo, "cannot write {}", (dir / "model.safetensors.index.json").string());
  fs::remove(dir / "model.safetensors");
  return written;
}

}  // namespace trellis::runtime
