// Every file Trident writes goes through here (docs/security.md section 1). Users point outputs into folders other
// people can write too (scratch space, /tmp, a cluster's project folder), so no output is ever opened through a
// name someone could have guessed and planted a link or a file at:
//  - a private folder is made next to the target with mkdtemp (a random name, created exclusively, mode 0700);
//  - the content is written inside it, under the target's own name (nobody else can create or replace anything
//    there), fsynced, and renamed onto the target. rename() replaces whatever the target name held (an old output,
//    or a link planted at that name) without following it, atomically: a reader sees the old file or the whole new
//    one, never a partial one;
//  - the private folder is removed; on any failure (an exception, a write error, disk full) everything is removed
//    and the target is left as it was.
// A write that cannot be done this way fails with one error naming the path and the flag that set it.
#pragma once
#include <string>
#include <string_view>

namespace trident::io {

// One staged output. Write to path() (any writer: HDF5, stdio, a child process), then commit().
class StagedFile {
 public:
  // target: the final path; what: how the user named it, for errors ("--json", "state dump", ...).
  StagedFile(std::string target, std::string what);
  ~StagedFile();  // discards an uncommitted file (and its private folder)
  StagedFile(const StagedFile&) = delete;
  StagedFile& operator=(const StagedFile&) = delete;

  // Inside the private folder; does not exist until the caller creates it.
  const std::string& path() const { return staged_; }
  const std::string& target() const { return target_; }
  // fsyncs the staged file, renames it onto the target, fsyncs the target's folder, removes the private folder.
  void commit();

 private:
  std::string target_, what_, dir_, staged_;
  bool committed_ = false;
};

// The whole of `bytes` written to target through a StagedFile.
void write_file(const std::string& target, std::string_view bytes, const std::string& what);

// Why `target` cannot be written, or "" when it can: checked before long work starts, by creating (and removing) a
// private folder next to it, so the answer is the one the write will get (root, read-only mounts, ACLs included).
// Never creates anything at the target name and never follows a link there.
std::string unwritable_reason(const std::string& target);
// Throws trident::Error "cannot write '<target>' (<what>): <reason>" when unwritable_reason is not empty.
void check_writable(const std::string& target, const std::string& what);

// open(2) of a new file that must not exist yet (O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, plus `flags`): a
// planted file or link at `path` makes it fail with EEXIST. Returns the descriptor or -1 (errno set).
int open_exclusive(const std::string& path, int flags, unsigned mode);

}  // namespace trident::io
