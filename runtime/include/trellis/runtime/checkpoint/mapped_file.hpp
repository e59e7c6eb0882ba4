// MappedFile: a read-only memory map of a whole file (RAII; unmapped on destruction).
// Pages are faulted in only when touched, so a rank that reads one slice of a large
// checkpoint brings in only the pages of that slice.
//
// Threading: immutable after construction; bytes() may be read from any thread.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>

namespace trellis::runtime {

class MappedFile {
 public:
  // Throws kNotFound (no such file) or kIo naming `path`. An empty file maps to an empty span.
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace trellis::runtime
