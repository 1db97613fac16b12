// check_output (cli_util.h): can the verb write where its flags point? Answered by the OS
// itself before any work, so a read-only folder fails in a second, not after a 35 s plan.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "cli_util.h"

namespace kareus::cli {
namespace {

namespace fs = std::filesystem;

std::string os_reason(int err) { return std::strerror(err); }

// errno of creating a file in the existing folder `dir`, or 0 when it can. Creates an unnamed
// temporary file (O_TMPFILE), or where the file system lacks those a named one, and removes it:
// nothing is left behind, and the answer is the OS's own (permissions, read-only mounts,
// ACLs, root's overrides).
int probe_folder(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::close(fd);
    return 0;
  }
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL && errno != ENOENT) return errno;
  static std::atomic<int> counter{0};
  const fs::path probe =
      dir / fmt::format(".kareus-write-check-{}-{}", ::getpid(), counter.fetch_add(1));
  const int named = ::open(probe.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (named < 0) return errno;
  ::close(named);
  ::unlink(probe.c_str());
  return 0;
}

// errno of opening the existing `file` for writing, or 0. Opens it to append, which changes
// nothing; a FIFO without a reader (ENXIO) counts as writable.
int probe_file(const fs::path& file) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd >= 0) {
    ::close(fd);
    return 0;
  }
  return errno == ENXIO ? 0 : errno;
}

fs::path folder_of(const fs::path& p) {
  return p.parent_path().empty() ? fs::path(".") : p.parent_path();
}

struct Checker {
  const std::string& flag;
  const std::string& path;

  [[noreturn]] void fail(const std::string& what, const std::string& allowed) const {
    throw InvalidInput(fmt::format("{} {}: {}; allowed: {}", flag, path, what, allowed));
  }

  // The folder `dir` (to hold new files) exists and takes new files, or, with `create`, its
  // nearest existing ancestor is a folder that does.
  void folder_takes_files(fs::path dir, bool create, const std::string& allowed) const {
    while (true) {
      struct stat st {};
      if (::stat(dir.c_str(), &st) == 0) {
        if (!S_ISDIR(st.st_mode)) {
          fail(fmt::format("{} is not a directory ({})", dir.string(), os_reason(ENOTDIR)),
               allowed);
        }
        if (const int e = probe_folder(dir); e != 0) {
          fail(fmt::format("cannot create files in the folder {} ({})", dir.string(), os_reason(e)),
               allowed);
        }
        return;
      }
      const int e = errno;
      if (e != ENOENT) {
        fail(fmt::format("cannot use the folder {} ({})", dir.string(), os_reason(e)), allowed);
      }
      if (!create) {
        fail(fmt::format("the folder {} does not exist ({})", dir.string(), os_reason(e)), allowed);
      }
      const fs::path up = folder_of(dir);
      if (up == dir)
        fail(fmt::format("cannot use the folder {} ({})", dir.string(), os_reason(e)), allowed);
      dir = up;
    }
  }
};

}  // namespace

void check_output(const std::string& flag, const std::string& path, OutputKind kind,
                  const std::vector<std::string>& inside) {
  if (path.empty()) throw InvalidInput(fmt::format("{} needs a path", flag));
  const Checker c{flag, path};
  const bool folder = kind == OutputKind::kFolder;
  const bool create = kind == OutputKind::kFolder || kind == OutputKind::kStore;
  const std::string allowed =
      folder   ? "a directory (created if missing) in a writable place"
      : create ? "a profile store path in a writable folder (missing folders are created)"
               : "a file path to write, in an existing, writable folder";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (folder) {
      if (!S_ISDIR(st.st_mode)) {
        c.fail(fmt::format("exists and is not a directory ({})", os_reason(ENOTDIR)), allowed);
      }
      c.folder_takes_files(path, false, allowed);
      // What the verb writes inside: an existing entry must be writable and of its kind.
      for (const std::string& rel : inside) {
        const bool sub_folder = !rel.empty() && rel.back() == '/';
        const fs::path p = fs::path(path) / fs::path(rel).relative_path();
        struct stat sub {};
        if (::stat(p.c_str(), &sub) != 0) continue;  // created later
        if (sub_folder != S_ISDIR(sub.st_mode)) {
          c.fail(fmt::format("{} is {} ({}), where {} writes {}", p.string(),
                             sub_folder ? "not a directory" : "a directory",
                             os_reason(sub_folder ? ENOTDIR : EISDIR), flag,
                             sub_folder ? "a folder" : "a file"),
                 allowed);
        }
        const int e = sub_folder ? probe_folder(p) : probe_file(p);
        if (e != 0) c.fail(fmt::format("cannot write {} ({})", p.string(), os_reason(e)), allowed);
      }
      return;
    }
    if (S_ISDIR(st.st_mode)) c.fail(fmt::format("is a directory ({})", os_reason(EISDIR)), allowed);
    if (const int e = probe_file(path); e != 0) {
      c.fail(fmt::format("cannot write the file ({})", os_reason(e)), allowed);
    }
    // A profile store writes its -wal and -shm files beside the database, a plot its script
    // and data beside the picture.
    if (kind == OutputKind::kStore || kind == OutputKind::kFileWithSiblings) {
      c.folder_takes_files(folder_of(path), false, allowed);
    }
    return;
  }
  const int e = errno;
  if (e == ENOTDIR) {
    // A folder on the way is a file: name it.
    fs::path up = folder_of(path);
    struct stat ust {};
    while (::stat(up.c_str(), &ust) != 0 && folder_of(up) != up) up = folder_of(up);
    if (!S_ISDIR(ust.st_mode)) {
      c.fail(fmt::format("{} is not a directory ({})", up.string(), os_reason(e)), allowed);
    }
  }
  if (e != ENOENT) c.fail(fmt::format("cannot write there ({})", os_reason(e)), allowed);
  c.folder_takes_files(folder ? fs::path(path) : folder_of(path), create, allowed);
}

void create_parent_folders(const std::string& flag, const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) return;
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) {
    throw InvalidInput(fmt::format("{} {}: cannot create the folder {} ({})", flag, path,
                                   parent.string(), ec.message()));
  }
}

}  // namespace kareus::cli
