#include "reference/atomic_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "reference/check.h"

namespace trident::io {
namespace fs = std::filesystem;

namespace {

std::string parent_of(const std::string& target) {
  const fs::path p(target);
  return p.parent_path().empty() ? std::string(".") : p.parent_path().string();
}

// mkdtemp of "<parent>/.<name>.XXXXXX": mode 0700, created exclusively. "" and errno on failure.
std::string make_private_dir(const std::string& target) {
  const fs::path p(target);
  std::string tmpl = (fs::path(parent_of(target)) / ("." + p.filename().string() + ".XXXXXX")).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) return "";
  return std::string(buf.data());
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

std::string unwritable_reason(const std::string& target) {
  if (target.empty()) return "the path is empty";
  const fs::path p(target);
  if (p.filename().empty() || p.filename() == "." || p.filename() == "..")
    return "the path names a directory, not a file";
  const std::string dir = parent_of(target);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return fmt::format("directory '{}' does not exist", dir);
  if (!S_ISDIR(st.st_mode)) return fmt::format("'{}' is not a directory", dir);
  if (::lstat(target.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return "the path is a directory";
  const std::string probe = make_private_dir(target);
  if (probe.empty()) return fmt::format("cannot create files in directory '{}': {}", dir, errno_text());
  ::rmdir(probe.c_str());
  return "";
}

void check_writable(const std::string& target, const std::string& what) {
  if (std::string why = unwritable_reason(target); !why.empty())
    fail(fmt::format("cannot write '{}' ({}): {}", target, what, why));
}

StagedFile::StagedFile(std::string target, std::string what) : target_(std::move(target)), what_(std::move(what)) {
  check_writable(target_, what_);
  dir_ = make_private_dir(target_);
  if (dir_.empty())
    fail(fmt::format("cannot write '{}' ({}): cannot create a private folder in '{}': {}", target_, what_,
                     parent_of(target_), errno_text()));
  staged_ = (fs::path(dir_) / fs::path(target_).filename()).string();
}

StagedFile::~StagedFile() {
  if (!committed_) ::unlink(staged_.c_str());
  ::rmdir(dir_.c_str());
}

void StagedFile::commit() {
  TD_CHECK(!committed_, "StagedFile::commit called twice for '{}'", target_);
  struct stat st {};
  if (::lstat(staged_.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    fail(fmt::format("cannot write '{}' ({}): the staged file was not written", target_, what_));
  fsync_path(staged_, O_RDONLY);
  if (::rename(staged_.c_str(), target_.c_str()) != 0)
    fail(fmt::format("cannot write '{}' ({}): rename failed: {}", target_, what_, errno_text()));
  committed_ = true;
  fsync_path(parent_of(target_), O_RDONLY | O_DIRECTORY);
}

void write_file(const std::string& target, std::string_view bytes, const std::string& what) {
  StagedFile out(target, what);
  const int fd = open_exclusive(out.path(), O_WRONLY, 0644);
  if (fd < 0) fail(fmt::format("cannot write '{}' ({}): {}", target, what, errno_text()));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t k = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const std::string why = errno_text();
      ::close(fd);
      fail(fmt::format("writing '{}' ({}) failed: {}", target, what, why));
    }
    done += static_cast<size_t>(k);
  }
  if (::close(fd) != 0) fail(fmt::format("writing '{}' ({}) failed: {}", target, what, errno_text()));
  out.commit();
}

int open_exclusive(const std::string& path, int flags, unsigned mode) {
  return ::open(path.c_str(), flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, static_cast<mode_t>(mode));
}

}  // namespace trident::io
