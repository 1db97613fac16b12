// SQLite-backed profile store. WAL mode with synchronous=NORMAL: a commit survives the process
// being killed (the WAL is in the OS page cache), and readers never block the writer. Each
// put() is its own transaction, so a crash loses at most the measurement in flight.
#include <fmt/format.h>
#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "kareus/error.h"
#include "kareus/hash.h"
#include "kareus/interrupt.h"
#include "kareus/store.h"

namespace kareus {
namespace {

constexpr const char* kFormat = "kareus-profile-store";
constexpr const char* kCreatePartitionShapes =
    "CREATE TABLE IF NOT EXISTS partition_shapes("
    " signature TEXT PRIMARY KEY, partition_key TEXT NOT NULL, compute_flops REAL NOT NULL,"
    " compute_bytes REAL NOT NULL, collective_bytes REAL NOT NULL,"
    " group_size INTEGER NOT NULL, slots TEXT NOT NULL)";

struct StmtDeleter {
  void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
};
using Stmt = std::unique_ptr<sqlite3_stmt, StmtDeleter>;

}  // namespace

struct ProfileStore::Impl {
  sqlite3* db = nullptr;
  std::string path;
  Stmt find, put, count, put_shape, shape;
  // While the constructor runs, every SQLite failure is the path's fault (/dev/null, a
  // directory, a file that is not SQLite, a read-only place): invalid input, not internal.
  bool opening = true;

  ~Impl() {
    find.reset();
    put.reset();
    count.reset();
    put_shape.reset();
    shape.reset();
    if (db) sqlite3_close(db);
  }

  [[noreturn]] void fail(const std::string& what, int rc) const {
    const std::string msg = db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    if (rc == SQLITE_NOTADB || rc == SQLITE_CORRUPT) {
      throw InvalidInput(fmt::format(
          "{}: not a usable profile store ({}: {}); pass --db with a new path or a Kareus store",
          path, what, msg));
    }
    if (rc == SQLITE_CANTOPEN || rc == SQLITE_READONLY || rc == SQLITE_PERM || opening) {
      throw InvalidInput(
          fmt::format("{}: cannot open the profile store ({}: {})", path, what, msg));
    }
    throw Error(fmt::format("{}: profile store error ({}: {})", path, what, msg));
  }

  void exec(const std::string& sql) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err);
    if (err) sqlite3_free(err);
    if (rc != SQLITE_OK) fail(sql.substr(0, 40), rc);
  }

  Stmt prepare(const std::string& sql) {
    sqlite3_stmt* s = nullptr;
    const int rc = sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr);
    if (rc != SQLITE_OK) fail("prepare", rc);
    return Stmt(s);
  }

  // SQLite answers a journal-mode switch with SQLITE_BUSY at once, without the busy handler,
  // while another connection holds the file (https://sqlite.org/wal.html, "Sometimes Queries
  // Return SQLITE_BUSY In WAL Mode"): several processes opening one new store would fail. The
  // mode persists in the file, so only a store not yet in WAL switches, and a busy switch is
  // retried within the busy timeout.
  void ensure_wal(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    while (single_text("PRAGMA journal_mode") != "wal") {
      Stmt s = prepare("PRAGMA journal_mode=WAL");
      const int rc = sqlite3_step(s.get());
      if (rc == SQLITE_ROW || rc == SQLITE_DONE) continue;
      if ((rc != SQLITE_BUSY && rc != SQLITE_LOCKED) ||
          std::chrono::steady_clock::now() > deadline) {
        fail("PRAGMA journal_mode=WAL", rc);
      }
      s.reset();
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }

  std::string single_text(const std::string& sql) {
    Stmt s = prepare(sql);
    const int rc = sqlite3_step(s.get());
    if (rc == SQLITE_ROW) {
      const auto* t = sqlite3_column_text(s.get(), 0);
      return t ? reinterpret_cast<const char*>(t) : "";
    }
    if (rc != SQLITE_DONE) fail(sql.substr(0, 40), rc);
    return "";
  }
};

ProfileStore::ProfileStore(const std::string& path) : impl_(std::make_unique<Impl>()), path_(path) {
  impl_->path = path;
  const int rc = sqlite3_open_v2(path.c_str(), &impl_->db,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr);
  if (rc != SQLITE_OK) impl_->fail("open", rc);
  constexpr std::chrono::milliseconds kBusyTimeout{10000};
  sqlite3_busy_timeout(impl_->db, static_cast<int>(kBusyTimeout.count()));
  // The first read fails with SQLITE_NOTADB on a file that is not SQLite.
  const std::string tables =
      impl_->single_text("SELECT group_concat(name) FROM sqlite_master WHERE type='table'");
  const std::string check = impl_->single_text("PRAGMA quick_check");
  if (check != "ok") {
    throw InvalidInput(fmt::format("{}: the profile store is corrupt (quick_check: {})", path,
                                   check.substr(0, 200)));
  }
  if (tables.empty()) {
    // Several processes may create the same new store at once (`eval --jobs`): one immediate
    // transaction with IF NOT EXISTS makes creation idempotent, and the busy timeout above
    // makes the others wait for it instead of failing.
    impl_->ensure_wal(kBusyTimeout);
    impl_->exec(
        std::string(
            "BEGIN IMMEDIATE;"
            "CREATE TABLE IF NOT EXISTS kareus_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "CREATE TABLE IF NOT EXISTS measurements("
            " gpu TEXT NOT NULL, backend TEXT NOT NULL, signature TEXT NOT NULL,"
            " label TEXT NOT NULL, freq_mhz INTEGER NOT NULL, sms INTEGER NOT NULL,"
            " slot TEXT NOT NULL, time_s REAL NOT NULL, energy_j REAL NOT NULL,"
            " dynamic_energy_j REAL NOT NULL, static_energy_j REAL NOT NULL,"
            " measured_at REAL NOT NULL,"
            " PRIMARY KEY(gpu, backend, signature, freq_mhz, sms, slot));") +
        kCreatePartitionShapes + ";" +
        fmt::format("INSERT OR IGNORE INTO kareus_meta VALUES('format', '{}'), ('version', '{}');",
                    kFormat, kFormatVersion) +
        "COMMIT;");
  } else if (tables.find("kareus_meta") == std::string::npos) {
    throw InvalidInput(fmt::format(
        "{}: an SQLite database that is not a Kareus profile store (tables: {}); pass --db "
        "with a new path",
        path, tables));
  }
  const std::string format = impl_->single_text("SELECT value FROM kareus_meta WHERE key='format'");
  const std::string version =
      impl_->single_text("SELECT value FROM kareus_meta WHERE key='version'");
  if (format != kFormat) {
    throw InvalidInput(fmt::format("{}: format '{}' is not '{}'", path, format, kFormat));
  }
  if (version != std::to_string(kFormatVersion)) {
    throw InvalidInput(
        fmt::format("{}: profile store version {} is not supported (this build "
                    "reads version {})",
                    path, version, kFormatVersion));
  }
  impl_->ensure_wal(kBusyTimeout);
  impl_->exec("PRAGMA synchronous=NORMAL");
  // Added after format version 1 without a version change: a store without the table reads as
  // one whose partitions have no recorded shape (they give no warm start), and gets it here, in
  // an immediate transaction so that concurrent openers wait rather than fail.
  if (!tables.empty() && tables.find("partition_shapes") == std::string::npos) {
    impl_->exec(std::string("BEGIN IMMEDIATE;") + kCreatePartitionShapes + ";COMMIT;");
  }
  impl_->find = impl_->prepare(
      "SELECT time_s, energy_j, dynamic_energy_j, static_energy_j FROM measurements WHERE "
      "gpu=?1 AND backend=?2 AND signature=?3 AND freq_mhz=?4 AND sms=?5 AND slot=?6");
  impl_->put = impl_->prepare(
      "INSERT OR IGNORE INTO measurements VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, "
      "?12)");
  impl_->count = impl_->prepare(
      "SELECT COUNT(*) FROM measurements WHERE gpu=?1 AND backend=?2 AND signature=?3");
  impl_->put_shape =
      impl_->prepare("INSERT OR IGNORE INTO partition_shapes VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7)");
  impl_->shape = impl_->prepare(
      "SELECT signature, partition_key, compute_flops, compute_bytes, collective_bytes, "
      "group_size, slots FROM partition_shapes WHERE signature=?1");
  impl_->opening = false;
}

ProfileStore::~ProfileStore() = default;

namespace {
void bind_text(sqlite3_stmt* s, int i, const std::string& v) {
  sqlite3_bind_text(s, i, v.c_str(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
}
}  // namespace

std::optional<Measurement> ProfileStore::find(const StoreKey& k) const {
  sqlite3_stmt* s = impl_->find.get();
  sqlite3_reset(s);
  bind_text(s, 1, k.gpu);
  bind_text(s, 2, k.backend);
  bind_text(s, 3, k.signature);
  sqlite3_bind_int(s, 4, k.freq_mhz);
  sqlite3_bind_int(s, 5, k.sms);
  bind_text(s, 6, k.slot);
  const int rc = sqlite3_step(s);
  if (rc == SQLITE_DONE) return std::nullopt;
  if (rc != SQLITE_ROW) impl_->fail("find", rc);
  Measurement m;
  m.time_s = sqlite3_column_double(s, 0);
  m.energy_j = sqlite3_column_double(s, 1);
  m.dynamic_energy_j = sqlite3_column_double(s, 2);
  m.static_energy_j = sqlite3_column_double(s, 3);
  sqlite3_reset(s);
  return m;
}

void ProfileStore::put(const StoreKey& k, const Measurement& m) {
  sqlite3_stmt* s = impl_->put.get();
  sqlite3_reset(s);
  bind_text(s, 1, k.gpu);
  bind_text(s, 2, k.backend);
  bind_text(s, 3, k.signature);
  bind_text(s, 4, k.label);
  sqlite3_bind_int(s, 5, k.freq_mhz);
  sqlite3_bind_int(s, 6, k.sms);
  bind_text(s, 7, k.slot);
  sqlite3_bind_double(s, 8, m.time_s);
  sqlite3_bind_double(s, 9, m.energy_j);
  sqlite3_bind_double(s, 10, m.dynamic_energy_j);
  sqlite3_bind_double(s, 11, m.static_energy_j);
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  sqlite3_bind_double(s, 12, now);
  const int rc = sqlite3_step(s);  // autocommit: durable when this returns
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) impl_->fail("put", rc);
}

std::size_t ProfileStore::count(const std::string& gpu, const std::string& backend,
                                const std::string& signature) const {
  sqlite3_stmt* s = impl_->count.get();
  sqlite3_reset(s);
  bind_text(s, 1, gpu);
  bind_text(s, 2, backend);
  bind_text(s, 3, signature);
  const int rc = sqlite3_step(s);
  if (rc != SQLITE_ROW) impl_->fail("count", rc);
  const auto n = static_cast<std::size_t>(sqlite3_column_int64(s, 0));
  sqlite3_reset(s);
  return n;
}

std::size_t ProfileStore::count_all() const {
  return static_cast<std::size_t>(
      std::stoull(impl_->single_text("SELECT COUNT(*) FROM measurements")));
}

namespace {

PartitionShape shape_from_row(sqlite3_stmt* s, int first) {
  auto text = [&](int i) {
    const auto* t = sqlite3_column_text(s, first + i);
    return std::string(t ? reinterpret_cast<const char*>(t) : "");
  };
  PartitionShape out;
  out.signature = text(0);
  out.key = text(1);
  out.compute_flops = sqlite3_column_double(s, first + 2);
  out.compute_bytes = sqlite3_column_double(s, first + 3);
  out.collective_bytes = sqlite3_column_double(s, first + 4);
  out.group_size = sqlite3_column_int(s, first + 5);
  const std::string slots = text(6);
  for (std::size_t a = 0; a < slots.size();) {
    std::size_t b = slots.find(',', a);
    if (b == std::string::npos) b = slots.size();
    out.slots.push_back(slots.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

}  // namespace

PartitionShape partition_shape(const Partition& p) {
  PartitionShape s;
  s.signature = p.signature;
  s.key = p.key;
  s.compute_flops = p.compute_flops();
  for (const auto& k : p.compute_ops) s.compute_bytes += k.bytes();
  s.collective_bytes = p.collective.payload_bytes;
  for (const auto& k : p.comm_tail) s.collective_bytes += k.payload_bytes;
  s.group_size = p.collective.group_size;
  s.slots = p.slot_names();
  return s;
}

void ProfileStore::put_shape(const PartitionShape& shape) {
  sqlite3_stmt* s = impl_->put_shape.get();
  sqlite3_reset(s);
  std::string slots;
  for (const auto& name : shape.slots) slots += (slots.empty() ? "" : ",") + name;
  bind_text(s, 1, shape.signature);
  bind_text(s, 2, shape.key);
  sqlite3_bind_double(s, 3, shape.compute_flops);
  sqlite3_bind_double(s, 4, shape.compute_bytes);
  sqlite3_bind_double(s, 5, shape.collective_bytes);
  sqlite3_bind_int(s, 6, shape.group_size);
  bind_text(s, 7, slots);
  const int rc = sqlite3_step(s);
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) impl_->fail("put_shape", rc);
}

std::optional<PartitionShape> ProfileStore::shape(const std::string& signature) const {
  sqlite3_stmt* s = impl_->shape.get();
  sqlite3_reset(s);
  bind_text(s, 1, signature);
  const int rc = sqlite3_step(s);
  if (rc == SQLITE_DONE) return std::nullopt;
  if (rc != SQLITE_ROW) impl_->fail("shape", rc);
  auto out = shape_from_row(s, 0);
  sqlite3_reset(s);
  return out;
}

std::vector<StoredPartition> ProfileStore::related(const std::string& gpu, const std::string& key,
                                                   const std::string& exclude,
                                                   double measured_before_s) const {
  // Rare (once per partition searched), so prepared here rather than kept.
  Stmt st = impl_->prepare(
      "SELECT s.signature, s.partition_key, s.compute_flops, s.compute_bytes, "
      "s.collective_bytes, s.group_size, s.slots, m.backend, m.freq_mhz, m.sms, m.slot, "
      "m.time_s, m.energy_j, m.dynamic_energy_j, m.static_energy_j FROM measurements m JOIN "
      "partition_shapes s ON m.signature = s.signature WHERE m.gpu=?1 AND s.partition_key=?2 "
      "AND m.signature<>?3 AND m.measured_at<?4 ORDER BY s.signature, m.backend, m.freq_mhz, "
      "m.sms, m.slot");
  sqlite3_stmt* s = st.get();
  bind_text(s, 1, gpu);
  bind_text(s, 2, key);
  bind_text(s, 3, exclude);
  sqlite3_bind_double(s, 4, std::min(measured_before_s, std::numeric_limits<double>::max()));
  std::vector<StoredPartition> out;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    const auto* b = sqlite3_column_text(s, 7);
    const std::string backend = b ? reinterpret_cast<const char*>(b) : "";
    const auto* sig = sqlite3_column_text(s, 0);
    const std::string signature = sig ? reinterpret_cast<const char*>(sig) : "";
    if (out.empty() || out.back().shape.signature != signature || out.back().backend != backend) {
      out.push_back({shape_from_row(s, 0), backend, {}});
    }
    PartitionConfig c;
    c.freq_mhz = sqlite3_column_int(s, 8);
    c.sms = sqlite3_column_int(s, 9);
    const auto* slot = sqlite3_column_text(s, 10);
    c.slot = slot ? reinterpret_cast<const char*>(slot) : "";
    Measurement m;
    m.time_s = sqlite3_column_double(s, 11);
    m.energy_j = sqlite3_column_double(s, 12);
    m.dynamic_energy_j = sqlite3_column_double(s, 13);
    m.static_energy_j = sqlite3_column_double(s, 14);
    out.back().points.emplace_back(c, m);
  }
  if (rc != SQLITE_DONE) impl_->fail("related", rc);
  return out;
}

// ---- CachedProfiler

MeasurementsNeeded::MeasurementsNeeded(std::string partition, std::vector<PartitionConfig> configs)
    : Error(fmt::format("partition {}: {} measurement(s) needed", partition, configs.size())),
      partition_(std::move(partition)),
      configs_(std::move(configs)) {}

std::string segment_signature(const Segment& s) {
  std::string text = s.name;
  for (const auto& k : s.kernels) {
    text += fmt::format("|{}:{:.6e}:{:.6e}:{}:{}:{}:{:.6e}:{}", k.name, k.flops, k.bytes(), k.m,
                        k.n, k.k, k.payload_bytes, k.group_size);
  }
  return fmt::format("segment-{:016x}", fnv1a(text));
}

StoreKey CachedProfiler::key(const Partition& p, const PartitionConfig& c) const {
  return {
      backend_.gpu().name, backend_.fingerprint(), p.signature, p.key, c.freq_mhz, c.sms, c.slot};
}

std::string CachedProfiler::memo_key(const StoreKey& k) {
  return fmt::format("{}|{}|{}|{}|{}", k.signature, k.label, k.freq_mhz, k.sms, k.slot);
}

bool CachedProfiler::stored(const Partition& p, const PartitionConfig& c) const {
  const StoreKey k = key(p, c);
  return memo_.count(memo_key(k)) || (store_ && store_->find(k).has_value());
}

Measurement CachedProfiler::serve(const StoreKey& k, const std::function<Measurement()>& measure) {
  const std::string mk = memo_key(k);
  if (auto it = memo_.find(mk); it != memo_.end()) return it->second;
  if (store_) {
    if (auto m = store_->find(k)) {
      ++reused_;
      return memo_.emplace(mk, *m).first->second;
    }
  }
  // A stop request (SIGINT, SIGTERM) ends the run here, between measurements: every point
  // measured so far is committed, nothing is half-written. A point during which the request
  // arrived is dropped, not committed: the signal may have disturbed it (the clock guard
  // resets locked clocks on a signal, so the rest of its window ran at another clock).
  throw_if_interrupted();
  const Measurement m = measure();
  throw_if_interrupted();
  if (store_) {
    // A real backend may change what it is while measuring (the cuda backend falls back from
    // cuDNN's fused attention to its own kernel): store under the fingerprint the point was
    // actually measured with, so the two are never mixed.
    StoreKey actual = k;
    actual.backend = backend_.fingerprint();
    store_->put(actual, m);
  }
  ++measured_;
  return memo_.emplace(mk, m).first->second;
}

void CachedProfiler::note_shape(const Partition& p) {
  if (!store_ || !shapes_written_.insert(p.signature).second) return;
  store_->put_shape(partition_shape(p));
}

Measurement CachedProfiler::measure(const Partition& p, const PartitionConfig& c) {
  note_shape(p);
  return serve(key(p, c), [&] { return backend_.measure(p, c); });
}

std::vector<Measurement> CachedProfiler::serve_parallel(const std::vector<StoreKey>& keys,
                                                        const std::vector<MeasureRequest>& requests,
                                                        const BatchCallback& on_point) {
  const std::size_t n = keys.size();
  std::vector<Measurement> out(n);
  std::vector<bool> have(n, false);
  std::size_t emitted = 0;
  auto flush = [&] {
    for (; emitted < n && have[emitted]; ++emitted) {
      if (on_point) on_point(emitted, out[emitted]);
    }
  };
  // Distinct missing points; a point repeated in the batch is measured once.
  std::vector<MeasureRequest> todo;
  std::vector<std::size_t> todo_first;
  std::map<std::string, std::vector<std::size_t>> waiting;
  for (std::size_t i = 0; i < n; ++i) {
    const std::string mk = memo_key(keys[i]);
    if (auto it = memo_.find(mk); it != memo_.end()) {
      out[i] = it->second;
      have[i] = true;
      continue;
    }
    if (auto w = waiting.find(mk); w != waiting.end()) {
      w->second.push_back(i);
      continue;
    }
    if (store_) {
      if (auto m = store_->find(keys[i])) {
        ++reused_;
        out[i] = memo_.emplace(mk, *m).first->second;
        have[i] = true;
        continue;
      }
    }
    waiting[mk] = {i};
    todo.push_back(requests[i]);
    todo_first.push_back(i);
  }
  flush();
  if (todo.empty()) return out;
  throw_if_interrupted();  // as in serve(): before handing out new points
  parallel_->measure_all(todo, [&](std::size_t j, const Measurement& m, const std::string& fp) {
    const std::size_t first = todo_first[j];
    // Committed on arrival: a run killed now keeps this point.
    if (store_) {
      StoreKey actual = keys[first];
      actual.backend = fp;
      store_->put(actual, m);
    }
    ++measured_;
    const std::string mk = memo_key(keys[first]);
    memo_.emplace(mk, m);
    for (std::size_t i : waiting[mk]) {
      out[i] = m;
      have[i] = true;
    }
    flush();
  });
  return out;
}

std::vector<Measurement> CachedProfiler::measure_batch(const Partition& p,
                                                       const std::vector<PartitionConfig>& configs,
                                                       const BatchCallback& on_point) {
  note_shape(p);
  if (parallel_ && !ask_) {
    std::vector<StoreKey> keys;
    std::vector<MeasureRequest> requests;
    for (const auto& c : configs) {
      keys.push_back(key(p, c));
      requests.push_back({&p, nullptr, c});
    }
    return serve_parallel(keys, requests, on_point);
  }
  std::vector<Measurement> out(configs.size());
  std::vector<PartitionConfig> missing;
  for (std::size_t i = 0; i < configs.size(); ++i) {
    const auto& c = configs[i];
    if (ask_ && !stored(p, c) && !backend_.can_measure(p, c)) {
      missing.push_back(c);
      continue;
    }
    out[i] = measure(p, c);
    if (on_point) on_point(i, out[i]);
  }
  if (!missing.empty()) throw MeasurementsNeeded(p.key, std::move(missing));
  return out;
}

StoreKey CachedProfiler::segment_key(const Segment& s, int freq_mhz) const {
  return {
      backend_.gpu().name, backend_.fingerprint(), segment_signature(s), s.name, freq_mhz, 0, "-"};
}

Measurement CachedProfiler::measure_segment(const Segment& s, int freq_mhz) {
  return serve(segment_key(s, freq_mhz), [&] { return backend_.measure_segment(s, freq_mhz); });
}

void CachedProfiler::measure_segments(const std::vector<std::pair<const Segment*, int>>& points) {
  if (!parallel_ || ask_) {
    for (const auto& [s, f] : points) measure_segment(*s, f);
    return;
  }
  std::vector<StoreKey> keys;
  std::vector<MeasureRequest> requests;
  for (const auto& [s, f] : points) {
    keys.push_back(segment_key(*s, f));
    requests.push_back({nullptr, s, {f, 0, "-"}});
  }
  serve_parallel(keys, requests, {});
}

}  // namespace kareus
