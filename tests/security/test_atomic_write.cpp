// Outputs go through a private folder and a rename (reference/atomic_write.h, docs/security.md section 1): a link
// planted at the target or at any name next to it is never followed, nothing is left behind, errors name the path.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "reference/atomic_write.h"
#include "reference/check.h"

namespace fs = std::filesystem;
using namespace trident;

namespace {

struct Scratch {
  fs::path dir;
  Scratch() {
    std::string t = (fs::temp_directory_path() / "trident-atomic-XXXXXX").string();
    dir = ::mkdtemp(t.data());
  }
  ~Scratch() { fs::remove_all(dir); }
};

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void spit(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

size_t entries(const fs::path& d) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(d)) ++n;
  return n;
}

}  // namespace

TEST(AtomicWrite, ALinkAtTheTargetIsReplacedNotFollowed) {
  Scratch s;
  const fs::path victim = s.dir / "victim", out = s.dir / "out.json";
  spit(victim, "precious");
  fs::create_symlink(victim, out);
  io::write_file(out.string(), "{}\n", "--json");
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_FALSE(fs::is_symlink(out));
  EXPECT_TRUE(fs::is_regular_file(out));
  EXPECT_EQ(slurp(out), "{}\n");
  EXPECT_EQ(entries(s.dir), 2u) << "a temporary name was left behind";
}

TEST(AtomicWrite, LinksAtEveryOldTemporaryNameAreNotFollowed) {
  // The names writers used before (".NAME.tmp.PID", "NAME.tmp.PID"): planted for this and the next pids.
  Scratch s;
  const fs::path victim = s.dir / "victim", out = s.dir / "state.h5";
  spit(victim, "precious");
  for (int p = ::getpid() - 5; p < ::getpid() + 50; ++p) {
    fs::create_symlink(victim, s.dir / (".state.h5.tmp." + std::to_string(p)));
    fs::create_symlink(victim, s.dir / ("state.h5.tmp." + std::to_string(p)));
  }
  const size_t before = entries(s.dir);
  io::write_file(out.string(), "data", "--dump");
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_EQ(slurp(out), "data");
  EXPECT_EQ(entries(s.dir), before + 1);
}

TEST(AtomicWrite, AnAbandonedStagedFileLeavesNothing) {
  Scratch s;
  const fs::path out = s.dir / "x.h5";
  spit(out, "old");
  {
    io::StagedFile f(out.string(), "test");
    spit(f.path(), "partial");
    EXPECT_TRUE(fs::exists(f.path()));
    EXPECT_EQ(fs::path(f.path()).parent_path().parent_path(), s.dir);
    struct stat st {};
    ASSERT_EQ(::stat(fs::path(f.path()).parent_path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u) << "the staging folder must be private";
  }  // no commit: an exception or a failed write
  EXPECT_EQ(slurp(out), "old");
  EXPECT_EQ(entries(s.dir), 1u);
}

TEST(AtomicWrite, ErrorsNameThePathAndTheFlag) {
  Scratch s;
  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::string missing = (s.dir / "no-such-dir" / "out.json").string();
  EXPECT_NE(error_of([&] { io::write_file(missing, "x", "--json"); }).find("cannot write '" + missing + "' (--json)"),
            std::string::npos);
  EXPECT_NE(io::unwritable_reason(missing).find("does not exist"), std::string::npos);
  fs::create_directory(s.dir / "d");
  EXPECT_EQ(io::unwritable_reason((s.dir / "d").string()), "the path is a directory");
  EXPECT_NE(error_of([&] { io::check_writable("", "--trace"); }).find("the path is empty"), std::string::npos);
  EXPECT_EQ(io::unwritable_reason((s.dir / "fine.svg").string()), "");
  EXPECT_EQ(entries(s.dir), 1u) << "the writability probe left something behind";
}

TEST(AtomicWrite, OpenExclusiveRefusesAPlantedLinkOrFile) {
  Scratch s;
  const fs::path victim = s.dir / "victim", p = s.dir / "id";
  spit(victim, "precious");
  fs::create_symlink(victim, p);
  EXPECT_LT(io::open_exclusive(p.string(), O_WRONLY, 0600), 0);
  fs::remove(p);
  spit(p, "planted");
  EXPECT_LT(io::open_exclusive(p.string(), O_WRONLY, 0600), 0);
  fs::remove(p);
  const int fd = io::open_exclusive(p.string(), O_WRONLY, 0600);
  EXPECT_GE(fd, 0);
  if (fd >= 0) ::close(fd);
  EXPECT_EQ(slurp(victim), "precious");
}
