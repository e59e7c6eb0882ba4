// CheckpointReader over one or several memory-mapped safetensors files. Slices are read
// row by row straight from the mapping, so only the pages of the requested rows are
// faulted in (a column-parallel rank touches only its rows; a row-parallel rank touches
// every row but only its column range of each).
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <sstream>

#include "convert.hpp"
#include "trellis/core/error.hpp"
#include "trellis/runtime/checkpoint/mapped_file.hpp"
#include "trellis/runtime/checkpoint/safetensors.hpp"

namespace trellis::runtime {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> read_text_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class SafetensorsReader final : public CheckpointReader {
 public:
  explicit SafetensorsReader(std::string where, fs::path config_dir)
      : where_(std::move(where)), config_dir_(std::move(config_dir)) {}

  // Maps `file` and registers its tensors; `only` (if non-null) restricts to the tensors
  // an index assigns to this file.
  void add_file(const fs::path& file) {
    files_.push_back(std::make_unique<MappedFile>(file));
    const MappedFile& mf = *files_.back();
    for (auto& e : parse_safetensors(mf.bytes(), mf.path())) {
      if (by_name_.count(e.name))
        throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}' is also stored in {}", mf.path(), e.name,
                    infos_[by_name_[e.name]].file);
      by_name_[e.name] = infos_.size();
      infos_.push_back(TensorInfo{e.name, e.dtype, e.shape, mf.path()});
      where_of_.push_back(Location{&mf, e.begin, e.end});
    }
  }

  void finish() {
    // Keep tensors() sorted by name; rebuild the index to match.
    std::vector<std::size_t> order(infos_.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](auto a, auto b) { return infos_[a].name < infos_[b].name; });
    std::vector<TensorInfo> infos;
    std::vector<Location> locs;
    by_name_.clear();
    for (auto i : order) {
      by_name_[infos_[i].name] = infos.size();
      infos.push_back(std::move(infos_[i]));
      locs.push_back(where_of_[i]);
    }
    infos_ = std::move(infos);
    where_of_ = std::move(locs);
  }

  std::string describe() const override { return where_; }

  std::span<const std::byte> stored_bytes(std::string_view name) const override {
    auto it = by_name_.find(name);
    if (it == by_name_.end()) throw_error(ErrorCode::kNotFound, "{}: tensor '{}' not found", where_, name);
    const Location& loc = where_of_[it->second];
    return loc.file->bytes().subspan(loc.begin, loc.end - loc.begin);
  }
  const std::vector<TensorInfo>& tensors() const override { return infos_; }

  const TensorInfo* find(std::string_view name) const override {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? nullptr : &infos_[it->second];
  }

  void read_slice(std::string_view name, const Slice& s, ElemType out, void* dst) const override {
    auto it = by_name_.find(name);
    if (it == by_name_.end())
      throw_error(ErrorCode::kNotFound, "{}: tensor '{}' not found", where_, name);
    const TensorInfo& t = infos_[it->second];
    const Location& loc = where_of_[it->second];
    convert::Stored stored;
    if (!convert::parse_stored(t.dtype, stored))
      throw_error(ErrorCode::kUnsupported, "{}: tensor '{}' has dtype {}; only F32, BF16 and F16 can be loaded",
                  t.file, t.name, t.dtype);
    if (s.row_begin < 0 || s.row_begin > s.row_end || s.row_end > t.rows() || s.col_begin < 0 ||
        s.col_begin > s.col_end || s.col_end > t.cols())
      throw_error(ErrorCode::kInvalidArgument, "{}: tensor '{}' is {}x{}; slice rows [{}, {}) cols [{}, {}) is outside it",
                  t.file, t.name, t.rows(), t.cols(), s.row_begin, s.row_end, s.col_begin, s.col_end);
    const std::size_t esize = safetensors_dtype_size(t.dtype), osize = elem_size(out);
    const std::size_t cols = static_cast<std::size_t>(s.cols());
    const std::byte* base = loc.file->bytes().data() + loc.begin;
    auto* d = static_cast<std::byte*>(dst);
    for (std::int64_t r = s.row_begin; r < s.row_end; ++r) {
      std::size_t off = (static_cast<std::size_t>(r) * static_cast<std::size_t>(t.cols()) +
                         static_cast<std::size_t>(s.col_begin)) * esize;
      // parse_safetensors proved begin + rows*cols*esize == end <= file size.
      convert::convert_row(base + off, stored, d, out, cols);
      d += cols * osize;
    }
  }

  std::optional<std::string> config_json() const override {
    return read_text_file(config_dir_ / "config.json");
  }

 private:
  struct Location {
    const MappedFile* file;
    std::uint64_t begin, end;
  };
  std::string where_;
  fs::path config_dir_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::vector<TensorInfo> infos_;
  std::vector<Location> where_of_;
  std::map<std::string, std::size_t, std::less<>> by_name_;
};

std::unique_ptr<CheckpointReader> open_index(const fs::path& dir, const fs::path& index) {
  auto text = read_text_file(index);
  if (!text) throw_error(ErrorCode::kIo, "cannot read {}", index.string());
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw_error(ErrorCode::kCorruptInput, "{}: not a JSON object with a 'weight_map' object", index.string());
  std::map<std::string, std::vector<std::string>> by_file;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    if (!it.value().is_string())
      throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}' maps to a non-string file", index.string(), it.key());
    auto f = it.value().get<std::string>();
    if (f.find('/') != std::string::npos || f == "..")
      throw_error(ErrorCode::kCorruptInput, "{}: tensor '{}' maps to '{}', outside the checkpoint directory",
                  index.string(), it.key(), f);
    by_file[f].push_back(it.key());
  }
  auto r = std::make_unique<SafetensorsReader>(dir.string(), dir);
  for (auto& [file, names] : by_file) {
    fs::path p = dir / file;
    if (!fs::exists(p))
      throw_error(ErrorCode::kNotFound, "{}: shard {} (holding tensor '{}') does not exist", index.string(),
                  p.string(), names.front());
    r->add_file(p);
    for (auto& n : names)
      if (!r->find(n))
        throw_error(ErrorCode::kNotFound, "{}: tensor '{}' is listed in {} but missing from that file",
                    p.string(), n, index.string());
  }
  r->finish();
  return r;
}

}  // namespace

std::unique_ptr<CheckpointReader> open_safetensors_file(const fs::path& file) {
  auto r = std::make_unique<SafetensorsReader>(file.string(), file.parent_path());
  r->add_file(file);
  r->finish();
  return r;
}

std::unique_ptr<CheckpointReader> open_safetensors_dir(const fs::path& dir) {
  if (fs::exists(dir / "model.safetensors.index.json"))
    return open_index(dir, dir / "model.safetensors.index.json");
  if (fs::exists(dir / "model.safetensors")) {
    auto r = std::make_unique<SafetensorsReader>(dir.string(), dir);
    r->add_file(dir / "model.safetensors");
    r->finish();
    return r;
  }
  throw_error(ErrorCode::kNotFound, "{}: no model.safetensors.index.json or model.safetensors", dir.string());
}

}  // namespace trellis::runtime
