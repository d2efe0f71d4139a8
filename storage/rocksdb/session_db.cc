#include "storage/rocksdb/session_db.h"

#include <algorithm>
#include <cstddef>
#include <deque>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/rate_limiter.h"
#include "rocksdb/sst_file_manager.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "rocksdb/write_buffer_manager.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/ownership.h"
#include "storage/rocksdb/current_check.h"
#include "storage/rocksdb/disk_full.h"
#include "storage/rocksdb/info_log.h"
#include "storage/rocksdb/keys.h"

namespace kvd::storage {
namespace {

// Column families, by index into Impl::cfs.
enum Cf { kDefault = 0, kManifests, kTokens, kResiduals, kNumCfs };
const char* const kCfNames[kNumCfs] = {"default", "manifests", "tokens",
                                       "residuals"};

// Format marker in the default family: refuses a directory written by an
// incompatible kvd (or by something else entirely).
const char kFormatKey[] = "kvd.session_db.format";
const char kFormatValue[] = "kvd-session-db/1";

// A residual chunk (C x row bytes, e.g. 64 x 1152 B for SmolLM2 in bf16) is
// far above this, so every one lands in a blob file; token chunks (4 B/row)
// and manifests stay in the LSM.
constexpr uint64_t kMinBlobBytes = 4096;

// A new session's import is written in batches of about this many bytes.
constexpr size_t kImportBatchBytes = 8 << 20;

bool Supported(rocksdb::CompressionType type) {
  for (rocksdb::CompressionType t : rocksdb::GetSupportedCompressions()) {
    if (t == type) return true;
  }
  return false;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string Name(absl::string_view tenant, absl::string_view session) {
  return absl::StrCat(tenant, "/", session);
}

std::string ChunkName(const ChunkId& id) {
  return id.layer == kTokenLayer
             ? absl::StrCat("token chunk ", id.index)
             : absl::StrCat("layer ", id.layer, " chunk ", id.index);
}

}  // namespace

struct SessionDb::Impl {
  SessionDbOptions options;
  // Sized at Open from the options and the disk (see SessionDbOptions).
  int64_t memtable_bytes = 0;
  int64_t reserve_bytes = 0;
  std::unique_ptr<rocksdb::Env> env;  // owns the composite env over `fs`
  std::shared_ptr<rocksdb::Cache> block_cache;
  std::unique_ptr<rocksdb::DB> db;
  std::vector<rocksdb::ColumnFamilyHandle*> cfs;

  // Commits take it shared; SweepOrphans takes it exclusively so it never
  // deletes a chunk that a concurrent commit has just made live.
  absl::Mutex commit_mu;
  mutable absl::Mutex mu;
  // Per tenant: the sum of its manifests' stored_bytes plus bytes reserved
  // by commits in flight.
  absl::flat_hash_map<std::string, int64_t> tenant_bytes ABSL_GUARDED_BY(mu);
  absl::Mutex resume_mu;  // serializes MaybeResume's DB::Resume calls
  // Set when a write failed for lack of space: RocksDB then refuses writes
  // until DB::Resume() succeeds.
  bool needs_resume ABSL_GUARDED_BY(mu) = false;
  // Why writes stopped, while RocksDB refuses them after finding a damaged
  // file (cleared by the next write that succeeds).
  absl::Status write_failure ABSL_GUARDED_BY(mu);
  // The batch sizes of the last kRecentTurns turn commits, refused ones
  // included (a ring): readiness asks whether a typical one still fits.
  static constexpr int kRecentTurns = 16;
  std::vector<int64_t> recent_turn_bytes ABSL_GUARDED_BY(mu);
  int next_turn_slot ABSL_GUARDED_BY(mu) = 0;

  void RecordTurnBytes(int64_t bytes) {
    absl::MutexLock lock(&mu);
    if (recent_turn_bytes.size() < kRecentTurns) {
      recent_turn_bytes.push_back(bytes);
    } else {
      recent_turn_bytes[next_turn_slot] = bytes;
    }
    next_turn_slot = (next_turn_slot + 1) % kRecentTurns;
  }

  // The median of the recent turn commits (0 before the first): what a
  // typical turn on this node writes.
  int64_t TypicalTurnBytes() const {
    std::vector<int64_t> sizes;
    {
      absl::MutexLock lock(&mu);
      sizes = recent_turn_bytes;
    }
    if (sizes.empty()) return 0;
    auto mid = sizes.begin() + static_cast<ptrdiff_t>(sizes.size() / 2);
    std::nth_element(sizes.begin(), mid, sizes.end());
    return *mid;
  }

  // Load's reading of the chunks `needed`, one stream (token ids, then each
  // layer) per map of `streams`, each handed to `observer` once complete.
  absl::Status ReadStreams(absl::string_view tenant, absl::string_view session,
                           const v1::SessionManifest& m,
                           const rocksdb::Snapshot* snapshot, Parts parts,
                           const std::map<ChunkId, int64_t>& needed,
                           const std::string& where, LoadObserver* observer,
                           std::deque<std::map<ChunkId, std::string>>* streams);

  ~Impl() {
    // With the WAL on, closing keeps memtables only in the log, so the next
    // open replays it and writes the blob files then: about 2 s for a
    // 4096-token session on startup, and its first resume read warm pages
    // where it should read the disk. Writing them now moves that cost to
    // the shutdown. A failure (a full disk) loses nothing: the log remains.
    std::vector<rocksdb::ColumnFamilyHandle*> open_cfs;
    for (rocksdb::ColumnFamilyHandle* cf : cfs) {
      if (cf != nullptr) open_cfs.push_back(cf);
    }
    if (db != nullptr && !open_cfs.empty()) {
      rocksdb::FlushOptions f;
      f.wait = true;
      db->Flush(f, open_cfs).PermitUncheckedError();
    }
    for (rocksdb::ColumnFamilyHandle* cf : cfs) {
      if (cf != nullptr) db->DestroyColumnFamilyHandle(cf);
    }
    if (db != nullptr) db->Close();
  }

  // One adapter from rocksdb::Status, so codes mean the same everywhere.
  absl::Status FromRocks(const rocksdb::Status& s,
                         absl::string_view what) const {
    if (s.ok()) return absl::OkStatus();
    const std::string msg =
        absl::StrCat(what, " in ", options.path, ": ", s.ToString());
    if (s.IsNoSpace() || s.subcode() == rocksdb::Status::kSpaceLimit) {
      return MarkDiskFull(absl::ResourceExhaustedError(
          absl::StrCat(msg, "; ", DiskFullAdvice(),
                       " (nothing of this write was committed)")));
    }
    // A file a live key points to (a blob file) is gone: damage, which no
    // retry mends. The sessions it held resume from their token ids (the
    // engine re-prefills on DATA_LOSS) and salvage exports what survives.
    if (s.IsPathNotFound()) {
      return absl::DataLossError(absl::StrCat(
          msg,
          "; a file of the session database is missing (deleted, or lost "
          "with its disk): sessions whose checkpoints it held continue by "
          "re-prefilling from their token ids, and 'kvd sessions export "
          "--all' salvages what is left"));
    }
    if (s.IsNotFound()) return absl::NotFoundError(msg);
    if (s.IsCorruption()) return absl::DataLossError(msg);
    if (s.IsInvalidArgument() || s.IsNotSupported()) {
      return absl::InvalidArgumentError(msg);
    }
    return absl::UnavailableError(
        absl::StrCat(msg, "; check the disk and retry"));
  }

  // RocksDB stops writing after ENOSPC and resumes on its own only when one
  // memtable's worth (write_buffer_size, half of MemtableBytes) is free
  // (SstFileManager's reserved buffer), so
  // "free some space" alone is not advice that works; deleting sessions
  // needs a write too.
  std::string DiskFullAdvice(bool at_open = false) const {
    if (at_open) {
      return absl::StrCat("the disk holding ", options.path,
                          " is full: free space on it, then start kvd again");
    }
    return absl::StrCat(
        "the disk holding ", options.path, " is full: free at least ",
        ReadableBytes(static_cast<int64_t>(MemtableBytes() / 2) +
                      reserve_bytes),
        " on it (writes resume by themselves once that much is free), then "
        "retry");
  }

  size_t MemtableBytes() const {
    return static_cast<size_t>(std::max<int64_t>(memtable_bytes, 1 << 20));
  }

  absl::StatusOr<DiskSpace> Space() const {
    return options.disk_space ? options.disk_space(options.path)
                              : StatDiskSpace(options.path);
  }

  // Sizes the memtable budget and the free-space reserve to the disk.
  void SizeToDisk() {
    memtable_bytes = options.memtable_bytes;
    reserve_bytes = options.reserve_free_bytes;
    absl::StatusOr<DiskSpace> space = Space();
    const int64_t total = space.ok() ? space->total_bytes : 0;
    if (total > 0) {
      memtable_bytes =
          std::min(memtable_bytes, std::max<int64_t>(total / 16, 1 << 20));
    }
    if (reserve_bytes <= 0) {
      reserve_bytes = static_cast<int64_t>(MemtableBytes());
      if (total > 0) reserve_bytes = std::min(reserve_bytes, total / 8);
    }
  }

  // RESOURCE_EXHAUSTED (a full disk) if writing `write_bytes` would leave
  // less than the reserve free. OK when the free space cannot be read:
  // RocksDB then reports a full disk itself. `typical`: `write_bytes` is a
  // typical turn's size (a readiness check), not one write's.
  absl::Status CheckRoom(int64_t write_bytes, absl::string_view what,
                         bool typical = false) const {
    absl::StatusOr<DiskSpace> space = Space();
    if (!space.ok() || space->available_bytes - write_bytes >= reserve_bytes) {
      return absl::OkStatus();
    }
    return MarkDiskFull(absl::ResourceExhaustedError(absl::StrCat(
        what, what.empty() ? "" : ": ", "the disk holding ", options.path,
        " has ", ReadableBytes(std::max<int64_t>(space->available_bytes, 0)),
        " free of ", ReadableBytes(space->total_bytes), " and kvd keeps ",
        ReadableBytes(reserve_bytes),
        " free so that deleting sessions and the database's own upkeep "
        "still work",
        write_bytes <= 0 ? ""
        : typical        ? absl::StrCat(" (a typical turn here writes ",
                                        ReadableBytes(write_bytes), ")")
                         : absl::StrCat(" (this write needs ",
                                        ReadableBytes(write_bytes), ")"),
        ". Delete sessions (HTTP DELETE /v1/sessions/ID or gRPC "
        "DeleteSession, sent to this node directly since it reports not "
        "ready meanwhile; or 'kvd sessions rm' while no kvd runs on this "
        "data directory) or free space on the disk; turns resume by "
        "themselves once there is room. Nothing of this write was stored")));
  }

  rocksdb::WriteOptions WriteOpts() const {
    rocksdb::WriteOptions w;
    w.sync = options.durability == Durability::kSync;
    return w;
  }

  int64_t QuotaOf(const std::string& tenant) const {
    auto it = options.tenant_quota_bytes.find(tenant);
    return it != options.tenant_quota_bytes.end() ? it->second
                                                  : options.default_quota_bytes;
  }

  absl::StatusOr<std::optional<v1::SessionManifest>> ReadManifest(
      absl::string_view tenant, absl::string_view session,
      const rocksdb::Snapshot* snapshot = nullptr) {
    rocksdb::ReadOptions r;
    r.snapshot = snapshot;
    std::string value;
    const std::string key = SessionKey(tenant, session);
    rocksdb::Status s = db->Get(r, cfs[kManifests], key, &value);
    if (s.IsNotFound()) return std::optional<v1::SessionManifest>();
    KVD_RETURN_IF_ERROR(
        FromRocks(s, absl::StrCat("reading the manifest of ", key)));
    v1::SessionManifest m;
    if (!m.ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat(
          "manifest of session ", key, " in ", options.path,
          " does not parse; delete the session (DeleteSession) and re-import "
          "it"));
    }
    KVD_RETURN_IF_ERROR(ValidateManifest(m));
    if (m.tenant() != tenant || m.session_id() != session) {
      return absl::DataLossError(absl::StrCat(
          "manifest stored under ", key, " names session ", m.tenant(), "/",
          m.session_id(), "; delete the session and re-import it"));
    }
    return std::optional<v1::SessionManifest>(std::move(m));
  }

  // Adds checked puts of `chunks` (ChunkId -> encoded chunk pairs) and of
  // the manifest to `batch`: what a turn and an import both write.
  // `payload_bytes`, if given, receives the chunks' payload bytes (what
  // stored_bytes counts).
  template <typename Chunks>
  absl::Status AddChunksAndManifest(const v1::SessionManifest& m,
                                    const Chunks& chunks,
                                    rocksdb::WriteBatch* batch,
                                    int64_t* payload_bytes = nullptr) {
    int64_t payload = 0;
    for (const auto& [id, value] : chunks) {
      KVD_ASSIGN_OR_RETURN(const int64_t bytes,
                           CheckChunkForWrite(m, id, value));
      payload += bytes;
      const Cf cf = id.layer == kTokenLayer ? kTokens : kResiduals;
      batch->Put(cfs[cf], ChunkKey(m.tenant(), m.session_id(), id), value);
    }
    batch->Put(cfs[kManifests], SessionKey(m.tenant(), m.session_id()),
               m.SerializeAsString());
    if (payload_bytes != nullptr) *payload_bytes = payload;
    return absl::OkStatus();
  }

  // Checks an encoded chunk a caller wants to store: it decodes, matches its
  // id, and has the manifest's row layout. Returns its payload bytes.
  absl::StatusOr<int64_t> CheckChunkForWrite(const v1::SessionManifest& m,
                                             const ChunkId& id,
                                             absl::string_view value) {
    const std::string where =
        absl::StrCat("chunk to store for ", Name(m.tenant(), m.session_id()));
    auto c = DecodeChunk(value, where);
    if (!c.ok()) return absl::InvalidArgumentError(c.status().message());
    absl::Status layout = CheckLayout(m, id, c->header, where);
    if (!layout.ok()) return absl::InvalidArgumentError(layout.message());
    if (id.layer != kTokenLayer &&
        std::find(m.layers().begin(), m.layers().end(), id.layer) ==
            m.layers().end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", ChunkName(id),
                       " is for a layer the manifest does not "
                       "checkpoint"));
    }
    return static_cast<int64_t>(c->payload.size());
  }

  // DATA_LOSS unless a decoded header agrees with its key and the manifest.
  static absl::Status CheckLayout(const v1::SessionManifest& m,
                                  const ChunkId& id, const v1::ChunkHeader& h,
                                  absl::string_view where) {
    auto bad = [&](absl::string_view what) {
      return absl::DataLossError(
          absl::StrCat(where, ": ", ChunkName(id), ": ", what));
    };
    if (h.layer() != id.layer || h.chunk_index() != id.index) {
      return bad(absl::StrCat("header says layer ", h.layer(), " chunk ",
                              h.chunk_index()));
    }
    if (h.first_position() != id.index * m.chunk_tokens() ||
        h.rows() > m.chunk_tokens()) {
      return bad(absl::StrCat("first position ", h.first_position(), " and ",
                              h.rows(), " rows do not fit chunks of ",
                              m.chunk_tokens(), " tokens"));
    }
    if (id.layer != kTokenLayer &&
        (h.dtype() != m.dtype() || h.row_bytes() != m.row_bytes())) {
      return bad(absl::StrCat("rows are ", v1::DType_Name(h.dtype()), " x ",
                              h.row_bytes(), " bytes but the manifest says ",
                              v1::DType_Name(m.dtype()), " x ", m.row_bytes()));
    }
    return absl::OkStatus();
  }

  // Reserves the quota a new manifest needs over the old one's; released by
  // FinishReservation whether or not the write succeeded.
  absl::Status Reserve(const std::string& tenant, int64_t delta) {
    absl::MutexLock lock(&mu);
    int64_t& bytes = tenant_bytes[tenant];
    const int64_t quota = QuotaOf(tenant);
    if (delta > 0 && quota > 0 && bytes + delta > quota) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant ", tenant, " would store ", bytes + delta,
          " bytes of session checkpoints, over its quota of ", quota,
          " bytes; delete sessions or raise the tenant's quota"));
    }
    bytes += delta;
    return absl::OkStatus();
  }
  void Unreserve(const std::string& tenant, int64_t delta) {
    absl::MutexLock lock(&mu);
    tenant_bytes[tenant] -= delta;
  }

  // Writes a batch that replaces `m`'s session manifest (old stored_bytes =
  // `old_bytes`), with quota accounting and disk-full recovery.
  absl::Status CommitBatch(const v1::SessionManifest& m, int64_t old_bytes,
                           rocksdb::WriteBatch* batch, absl::string_view what) {
    KVD_RETURN_IF_ERROR(MaybeResume());
    KVD_RETURN_IF_ERROR(CheckRoom(
        static_cast<int64_t>(batch->GetDataSize()),
        absl::StrCat(what, " for session ", Name(m.tenant(), m.session_id()))));
    const int64_t delta = m.stored_bytes() - old_bytes;
    KVD_RETURN_IF_ERROR(Reserve(m.tenant(), delta));
    absl::Status written = WriteBatchFor(m, batch, what);
    if (!written.ok()) Unreserve(m.tenant(), delta);
    return written;
  }

  // Writes a batch of `m`'s session, keeping the books on a failure: a full
  // disk makes later writes resume first, a damaged file stops readiness.
  absl::Status WriteBatchFor(const v1::SessionManifest& m,
                             rocksdb::WriteBatch* batch,
                             absl::string_view what) {
    rocksdb::Status s = db->Write(WriteOpts(), batch);
    if (!s.ok()) {
      if (s.IsNoSpace()) {
        absl::MutexLock lock(&mu);
        needs_resume = true;
      }
      if (s.IsCorruption() || s.IsPathNotFound()) {
        // A flush or compaction read a damaged file (or found one gone):
        // RocksDB now refuses every write until it is reopened, and the
        // next compaction of that file stops it again. Only salvaging the
        // sessions helps. Says nothing of the session: readiness probes
        // show it unauthenticated.
        const absl::Status failure = absl::DataLossError(absl::StrCat(
            "the session database at ", options.path,
            " stopped taking writes because one of its files is damaged (",
            s.ToString(),
            "). Reads still work. To recover: stop kvd, run 'kvd sessions "
            "export --all DIR --data-dir D' (every tenant's sessions, as "
            "DIR/TENANT/NAME.kvds), move D/sessions aside, then run 'kvd "
            "sessions import --all DIR --data-dir D'"));
        absl::MutexLock lock(&mu);
        write_failure = failure;
        return absl::DataLossError(absl::StrCat(
            what, " for session ", Name(m.tenant(), m.session_id()), ": ",
            failure.message()));
      }
      return FromRocks(s, absl::StrCat(what, " for session ",
                                       Name(m.tenant(), m.session_id())));
    }
    absl::MutexLock lock(&mu);
    write_failure = absl::OkStatus();
    return absl::OkStatus();
  }

  absl::Status MaybeResume() {
    {
      absl::MutexLock lock(&mu);
      if (!needs_resume) return absl::OkStatus();
    }
    // One Resume at a time: two at once make the second Busy, which would
    // read as a disk still full (readiness probes call this too).
    absl::MutexLock resuming(&resume_mu);
    {
      absl::MutexLock lock(&mu);
      if (!needs_resume) return absl::OkStatus();
    }
    rocksdb::Status s = db->Resume();
    if (s.IsBusy()) {
      // RocksDB's own recovery (its SstFileManager polls the free space
      // after a NoSpace error) is running; it clears the error by itself
      // once there is room.
      return MarkDiskFull(absl::ResourceExhaustedError(absl::StrCat(
          "the session database stopped writing: ", DiskFullAdvice(),
          " (nothing was written)")));
    }
    if (!s.ok()) return FromRocks(s, "recovering from an earlier write error");
    absl::MutexLock lock(&mu);
    needs_resume = false;
    return absl::OkStatus();
  }

  absl::Status Open();
  absl::Status RebuildTenantBytes();
};

absl::Status SessionDb::Impl::Open() {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (options.path.empty()) {
    return absl::InvalidArgumentError(
        "SessionDbOptions.path is empty; set it to a directory for session "
        "checkpoints");
  }
  const fs::file_status st = fs::status(options.path, ec);
  if (fs::exists(st) && !fs::is_directory(st)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session database path ", options.path,
        " exists and is not a directory; point the path at a directory (or a "
        "path that does not exist yet)"));
  }
  if (fs::is_directory(st)) {
    KVD_RETURN_IF_ERROR(RefuseDataWithoutCurrent(options.path));
  }
  std::shared_ptr<rocksdb::FileSystem> file_system =
      options.file_system ? options.file_system
                          : rocksdb::FileSystem::Default();
  env = rocksdb::NewCompositeEnv(file_system);

  rocksdb::DBOptions db_opts;
  db_opts.env = env.get();
  // kvd writes RocksDB's LOG itself (info_log.h: the stock logger aborts the
  // process on a full disk). The directory must exist for it; an error
  // creating it is left to DB::Open, which explains it.
  fs::create_directories(options.path, ec);
  db_opts.info_log = std::make_shared<InfoLogFile>(options.path + "/LOG");
  SizeToDisk();
  // RocksDB recovers from a full disk on its own only with an
  // SstFileManager, which polls the free space after a NoSpace error.
  db_opts.sst_file_manager.reset(
      rocksdb::NewSstFileManager(env.get(), db_opts.info_log));
  db_opts.create_if_missing = true;
  db_opts.create_missing_column_families = true;
  db_opts.max_background_jobs = 2;
  // A resume reads a session's chunks in key order, which is their order in
  // the blob file a flush wrote; RocksDB's default advises the kernel that
  // reads are random, which turns off its readahead, so each chunk (~49 KB
  // for a 4096-token kv session) became its own disk read: 490 ms for that
  // session's 94 MB, 250-390 ms with readahead (docs/BENCHMARKS.md).
  db_opts.advise_random_on_open = false;
  if (options.background_bytes_per_sec > 0) {
    db_opts.rate_limiter.reset(
        rocksdb::NewGenericRateLimiter(options.background_bytes_per_sec));
  }
  block_cache = rocksdb::NewLRUCache(
      static_cast<size_t>(std::max<int64_t>(options.block_cache_bytes, 0)));
  // Memtables hold whole residual chunks until a flush moves them to blob
  // files; without a cap the four families could keep up to 4 x 2 x 64 MiB.
  const size_t memtables = MemtableBytes();
  db_opts.write_buffer_manager =
      std::make_shared<rocksdb::WriteBufferManager>(memtables);

  auto cf_options = [&](Cf cf) {
    rocksdb::ColumnFamilyOptions o;
    o.write_buffer_size = memtables / 2;
    rocksdb::BlockBasedTableOptions table;
    table.block_cache = block_cache;
    table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
    // Manifests and token ids are small; LZ4 costs little on them.
    o.compression = Supported(rocksdb::kLZ4Compression)
                        ? rocksdb::kLZ4Compression
                        : rocksdb::kNoCompression;
    if (cf == kResiduals) {
      o.enable_blob_files = true;
      o.min_blob_size = kMinBlobBytes;
      o.enable_blob_garbage_collection = true;
      // LZ4 saves nothing on bf16 rows; ZSTD about 19% at a third less
      // throughput (docs/BENCHMARKS.md), so it is the only option offered.
      o.blob_compression_type =
          options.compress_residuals && Supported(rocksdb::kZSTD)
              ? rocksdb::kZSTD
              : rocksdb::kNoCompression;
    }
    return o;
  };
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (int cf = 0; cf < kNumCfs; ++cf) {
    descriptors.emplace_back(kCfNames[cf], cf_options(static_cast<Cf>(cf)));
  }
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s =
      rocksdb::DB::Open(db_opts, options.path, descriptors, &cfs, &raw);
  if (!s.ok()) {
    cfs.clear();
    std::string hint =
        "; check that the directory is writable and on a local disk";
    // RocksDB's words for a LOCK held by another process, and by this one.
    const std::string text = s.ToString();
    if (s.IsIOError() && (text.find("While lock file") != std::string::npos ||
                          text.find("lock hold by") != std::string::npos)) {
      hint = "; another kvd process has it open: stop it or use another path";
    } else if (s.IsNoSpace()) {
      hint = absl::StrCat("; ", DiskFullAdvice(/*at_open=*/true));
    } else if (s.IsCorruption()) {
      hint =
          "; the database is damaged (a file is corrupt or missing): restore "
          "the directory from a backup, or move it aside to start with no "
          "sessions";
    }
    if (s.IsInvalidArgument()) {
      hint =
          "; the directory holds a RocksDB database that is not a kvd "
          "session database: choose another path";
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open the session database at ", options.path, ": ",
                     s.ToString(), hint));
  }
  db.reset(raw);

  std::string marker;
  s = db->Get(rocksdb::ReadOptions(), cfs[kDefault], kFormatKey, &marker);
  if (s.IsNotFound()) {
    s = db->Put(WriteOpts(), cfs[kDefault], kFormatKey, kFormatValue);
    KVD_RETURN_IF_ERROR(FromRocks(s, "writing the format marker"));
  } else if (!s.ok()) {
    return FromRocks(s, "reading the format marker");
  } else if (marker != kFormatValue) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session database at ", options.path, " has format \"", marker,
        "\" but this kvd reads \"", kFormatValue,
        "\"; open it with the kvd release that wrote it, or use another "
        "path"));
  }
  return RebuildTenantBytes();
}

absl::Status SessionDb::Impl::RebuildTenantBytes() {
  // The per-tenant totals live only in memory; a restart rebuilds them from
  // the manifests on disk so quotas hold across restarts.
  absl::flat_hash_map<std::string, int64_t> totals;
  std::unique_ptr<rocksdb::Iterator> it(
      db->NewIterator(rocksdb::ReadOptions(), cfs[kManifests]));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    v1::SessionManifest m;
    if (!m.ParseFromArray(it->value().data(),
                          static_cast<int>(it->value().size()))) {
      // Counted as zero; Load reports the damage for this session.
      continue;
    }
    totals[m.tenant()] += m.stored_bytes();
  }
  KVD_RETURN_IF_ERROR(FromRocks(it->status(), "scanning manifests"));
  absl::MutexLock lock(&mu);
  tenant_bytes = std::move(totals);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SessionDb>> SessionDb::Open(
    const SessionDbOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  KVD_RETURN_IF_ERROR(impl->Open());
  return std::unique_ptr<SessionDb>(new SessionDb(std::move(impl)));
}

SessionDb::SessionDb(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SessionDb::~SessionDb() = default;

absl::Status SessionDb::CommitTurn(const TurnUpdate& update) {
  const v1::SessionManifest& m = update.manifest;
  KVD_RETURN_IF_ERROR(ValidateManifestForWrite(m));
  rocksdb::WriteBatch batch;
  for (const ChunkId& id : update.erase) {
    const Cf cf = id.layer == kTokenLayer ? kTokens : kResiduals;
    batch.Delete(impl_->cfs[cf], ChunkKey(m.tenant(), m.session_id(), id));
  }
  KVD_RETURN_IF_ERROR(impl_->AddChunksAndManifest(m, update.put, &batch));
  absl::ReaderMutexLock commit(&impl_->commit_mu);
  KVD_ASSIGN_OR_RETURN(auto old,
                       impl_->ReadManifest(m.tenant(), m.session_id()));
  // The session's turns are ordered by its owner (the engine), and a change
  // of owner goes through the same lock there, so the stored manifest read
  // here is the one this batch replaces.
  if (old) KVD_RETURN_IF_ERROR(CheckFence(*old, update));
  // A turn that stores tokens: not a session's creation, which stores none,
  // nor an ownership change.
  if (!update.put.empty() && !update.ownership_change) {
    impl_->RecordTurnBytes(static_cast<int64_t>(batch.GetDataSize()));
  }
  return impl_->CommitBatch(
      m, old ? old->stored_bytes() : 0, &batch,
      update.ownership_change ? "changing the owner" : "committing a turn");
}

namespace {

// Quotas and the per-tenant totals trust stored_bytes; an imported file must
// not be able to claim less (or more) than it stores.
absl::Status CheckStoredBytes(const v1::SessionManifest& m,
                              int64_t payload_bytes) {
  if (m.stored_bytes() == payload_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "session ", Name(m.tenant(), m.session_id()), ": the manifest says ",
      m.stored_bytes(), " stored bytes but its chunks hold ", payload_bytes,
      "; the session file is damaged or was edited: export it again"));
}

}  // namespace

absl::Status SessionDb::PutSession(const SessionCheckpoint& checkpoint) {
  const v1::SessionManifest& m = checkpoint.manifest();
  KVD_RETURN_IF_ERROR(ValidateManifestForWrite(m));
  bool is_new = false;
  {
    absl::ReaderMutexLock commit(&impl_->commit_mu);
    absl::StatusOr<std::optional<v1::SessionManifest>> old =
        impl_->ReadManifest(m.tenant(), m.session_id());
    is_new = old.ok() && !old->has_value();
  }
  if (is_new) return PutNewSession(checkpoint);
  const std::string prefix = ChunkPrefix(m.tenant(), m.session_id());
  const std::string end = PrefixUpperBound(prefix);
  rocksdb::WriteBatch batch;
  // Batch entries apply in order, so the puts below win over these ranges.
  batch.DeleteRange(impl_->cfs[kTokens], prefix, end);
  batch.DeleteRange(impl_->cfs[kResiduals], prefix, end);
  int64_t payload_bytes = 0;
  KVD_RETURN_IF_ERROR(impl_->AddChunksAndManifest(m, checkpoint.chunks(),
                                                  &batch, &payload_bytes));
  KVD_RETURN_IF_ERROR(CheckStoredBytes(m, payload_bytes));
  absl::ReaderMutexLock commit(&impl_->commit_mu);
  auto old = impl_->ReadManifest(m.tenant(), m.session_id());
  // A damaged old manifest must not block replacing it.
  const int64_t old_bytes = old.ok() && *old ? (*old)->stored_bytes() : 0;
  return impl_->CommitBatch(m, old_bytes, &batch, "importing");
}

absl::Status SessionDb::PutNewSession(const SessionCheckpoint& checkpoint) {
  const v1::SessionManifest& m = checkpoint.manifest();
  const std::string name = Name(m.tenant(), m.session_id());
  // Every chunk checked and counted before anything is written.
  int64_t payload_bytes = 0, value_bytes = 0;
  for (const auto& [id, value] : checkpoint.chunks()) {
    KVD_ASSIGN_OR_RETURN(const int64_t bytes,
                         impl_->CheckChunkForWrite(m, id, value));
    payload_bytes += bytes;
    value_bytes += static_cast<int64_t>(value.size());
  }
  KVD_RETURN_IF_ERROR(CheckStoredBytes(m, payload_bytes));
  KVD_RETURN_IF_ERROR(impl_->MaybeResume());
  KVD_RETURN_IF_ERROR(
      impl_->CheckRoom(value_bytes, absl::StrCat("importing session ", name)));
  // The chunks in bounded batches, then the manifest, the commit record: a
  // crash between leaves chunks no manifest accounts for, which Load
  // ignores and `kvd sessions sweep` (SweepOrphans) removes. So an import holds
  // one batch of chunks in memory beyond the checkpoint, not a copy of all of
  // them.
  const std::string prefix = ChunkPrefix(m.tenant(), m.session_id());
  auto clean_up = [&] {
    rocksdb::WriteBatch undo;
    undo.DeleteRange(impl_->cfs[kTokens], prefix, PrefixUpperBound(prefix));
    undo.DeleteRange(impl_->cfs[kResiduals], prefix, PrefixUpperBound(prefix));
    (void)impl_->db->Write(impl_->WriteOpts(), &undo);
  };
  // Held from the first batch to the manifest: SweepOrphans (exclusive)
  // would take the chunks written so far for orphans and delete them.
  absl::ReaderMutexLock commit(&impl_->commit_mu);
  // The tenant's quota is reserved before the first byte is written, so a
  // refused import leaves nothing behind.
  KVD_RETURN_IF_ERROR(impl_->Reserve(m.tenant(), m.stored_bytes()));
  auto fail = [&](absl::Status s) {
    impl_->Unreserve(m.tenant(), m.stored_bytes());
    clean_up();
    return s;
  };
  rocksdb::WriteBatch batch;
  for (const auto& [id, value] : checkpoint.chunks()) {
    const Cf cf = id.layer == kTokenLayer ? kTokens : kResiduals;
    batch.Put(impl_->cfs[cf], ChunkKey(m.tenant(), m.session_id(), id), value);
    if (batch.GetDataSize() < kImportBatchBytes) continue;
    if (absl::Status s = impl_->WriteBatchFor(m, &batch, "importing");
        !s.ok()) {
      return fail(s);
    }
    batch.Clear();
  }
  batch.Put(impl_->cfs[kManifests], SessionKey(m.tenant(), m.session_id()),
            m.SerializeAsString());
  // Reserved above: the manifest's bytes count as already there.
  const absl::Status s =
      impl_->CommitBatch(m, m.stored_bytes(), &batch, "importing");
  return s.ok() ? s : fail(s);
}

absl::StatusOr<v1::SessionManifest> SessionDb::GetManifest(
    absl::string_view tenant, absl::string_view session) {
  KVD_RETURN_IF_ERROR(ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(ValidateName("session id", session));
  KVD_ASSIGN_OR_RETURN(auto m, impl_->ReadManifest(tenant, session));
  if (!m) {
    return absl::NotFoundError(
        absl::StrCat("tenant ", tenant, " has no stored session ", session));
  }
  return *std::move(m);
}

absl::StatusOr<SessionCheckpoint> SessionDb::Load(absl::string_view tenant,
                                                  absl::string_view session,
                                                  Parts parts,
                                                  LoadObserver* observer) {
  KVD_RETURN_IF_ERROR(ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(ValidateName("session id", session));
  // One snapshot: the manifest and the chunks it accounts for come from the
  // same committed state even while turns are being committed.
  const rocksdb::Snapshot* snapshot = impl_->db->GetSnapshot();
  struct Release {
    rocksdb::DB* db;
    const rocksdb::Snapshot* s;
    ~Release() { db->ReleaseSnapshot(s); }
  } release{impl_->db.get(), snapshot};

  KVD_ASSIGN_OR_RETURN(auto found,
                       impl_->ReadManifest(tenant, session, snapshot));
  if (!found) {
    return absl::NotFoundError(
        absl::StrCat("tenant ", tenant, " has no stored session ", session));
  }
  const v1::SessionManifest& m = *found;
  const int64_t c = m.chunk_tokens();
  // Rows each needed chunk must hold at least, by id.
  std::map<ChunkId, int64_t> needed;
  for (int64_t i = 0; i < CeilDiv(m.token_count(), c); ++i) {
    needed[ChunkId{kTokenLayer, i}] = std::min(c, m.token_count() - i * c);
  }
  if (parts == Parts::kAll) {
    for (int l = 0; l < m.layers_size(); ++l) {
      for (int64_t i = m.first_position(l) / c; i < CeilDiv(m.length(), c);
           ++i) {
        needed[ChunkId{m.layers(l), i}] = std::min(c, m.length() - i * c);
      }
    }
  }

  const std::string where = absl::StrCat("session ", Name(tenant, session),
                                         " in ", impl_->options.path);
  if (observer != nullptr) observer->OnManifest(m);
  // One map per stream (token ids, then each layer), kept apart while an
  // observer may be reading them and merged once it is done.
  std::deque<std::map<ChunkId, std::string>> streams;
  absl::Status read = impl_->ReadStreams(tenant, session, m, snapshot, parts,
                                         needed, where, observer, &streams);
  if (observer != nullptr) observer->OnEnd(read);
  KVD_RETURN_IF_ERROR(read);
  std::map<ChunkId, std::string> chunks;
  for (auto& stream : streams) chunks.merge(stream);
  SessionCheckpoint cp;
  cp.Reset(m, std::move(chunks));
  return cp;
}

absl::Status SessionDb::Impl::ReadStreams(
    absl::string_view tenant, absl::string_view session,
    const v1::SessionManifest& m, const rocksdb::Snapshot* snapshot,
    Parts parts, const std::map<ChunkId, int64_t>& needed,
    const std::string& where, LoadObserver* observer,
    std::deque<std::map<ChunkId, std::string>>* streams) {
  // Streams end in key order: each needed stream below `layer` is complete
  // once a key of `layer` (or the end) is reached.
  auto next_needed = needed.begin();
  auto close_streams_below = [&](int64_t layer) -> absl::Status {
    while (next_needed != needed.end() && next_needed->first.layer < layer) {
      const int64_t l = next_needed->first.layer;
      if (streams->empty() || streams->back().empty() ||
          streams->back().begin()->first.layer != l) {
        streams->emplace_back();
      }
      for (; next_needed != needed.end() && next_needed->first.layer == l;
           ++next_needed) {
        if (streams->back().count(next_needed->first) == 0) {
          return absl::DataLossError(absl::StrCat(
              where, ": ", ChunkName(next_needed->first),
              " is missing although the manifest needs it; delete the session "
              "and re-import it, or resume from tokens"));
        }
      }
      if (observer != nullptr) observer->OnStream(l, streams->back());
    }
    return absl::OkStatus();
  };
  const std::string prefix = ChunkPrefix(tenant, session);
  const std::string end = PrefixUpperBound(prefix);
  for (Cf cf : {kTokens, kResiduals}) {
    if (cf == kResiduals && parts != Parts::kAll) break;
    rocksdb::ReadOptions r;
    r.snapshot = snapshot;
    rocksdb::Slice upper(end);
    r.iterate_upper_bound = &upper;
    r.fill_cache = cf != kResiduals;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(r, cfs[cf]));
    for (it->Seek(prefix); it->Valid(); it->Next()) {
      auto key =
          ParseChunkKey(absl::string_view(it->key().data(), it->key().size()));
      if (!key) {
        return absl::DataLossError(absl::StrCat(
            where, ": malformed chunk key; run SweepOrphans or re-import"));
      }
      auto want = needed.find(key->id);
      if (want == needed.end()) continue;  // beyond the manifest: not trusted
      KVD_RETURN_IF_ERROR(close_streams_below(key->id.layer));
      const absl::string_view value(it->value().data(), it->value().size());
      KVD_ASSIGN_OR_RETURN(DecodedChunk decoded, DecodeChunk(value, where));
      KVD_RETURN_IF_ERROR(CheckLayout(m, key->id, decoded.header, where));
      if (decoded.header.rows() < want->second) {
        return absl::DataLossError(absl::StrCat(
            where, ": ", ChunkName(key->id), " holds ", decoded.header.rows(),
            " rows but the manifest needs ", want->second,
            "; delete the session and re-import it, or resume from tokens"));
      }
      if (streams->empty() || streams->back().empty() ||
          streams->back().begin()->first.layer != key->id.layer) {
        streams->emplace_back();
      }
      streams->back().emplace(key->id, std::string(value));
    }
    KVD_RETURN_IF_ERROR(
        FromRocks(it->status(),
                  absl::StrCat("reading chunks of ", Name(tenant, session))));
  }
  return close_streams_below(std::numeric_limits<int64_t>::max());
}

absl::StatusOr<SessionDb::Salvaged> SessionDb::LoadForSalvage(
    absl::string_view tenant, absl::string_view session) {
  absl::StatusOr<SessionCheckpoint> whole = Load(tenant, session);
  if (whole.ok()) return Salvaged{*std::move(whole), absl::OkStatus()};
  if (whole.status().code() != absl::StatusCode::kDataLoss) {
    return whole.status();
  }
  absl::StatusOr<SessionCheckpoint> tokens =
      Load(tenant, session, Parts::kManifestAndTokens);
  if (!tokens.ok()) {
    return absl::DataLossError(absl::StrCat(
        "session ", Name(tenant, session),
        " cannot be salvaged: it does not load (", whole.status().message(),
        "), and its manifest and token ids alone do not either (",
        tokens.status().message(), ")"));
  }
  KVD_ASSIGN_OR_RETURN(SessionCheckpoint only, TokensOnly(*tokens));
  return Salvaged{std::move(only), whole.status()};
}

absl::StatusOr<SessionListPage> SessionDb::ListSessions(
    absl::string_view tenant, absl::string_view page_token, int64_t page_size) {
  KVD_RETURN_IF_ERROR(ValidateName("tenant", tenant));
  if (page_size < 1 || page_size > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size ", page_size, " is outside 1..1000"));
  }
  if (!page_token.empty() && !ValidateName("page token", page_token).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page token \"", page_token,
        "\" was not returned by ListSessions; pass an empty token to start"));
  }
  const std::string prefix = TenantPrefix(tenant);
  const std::string end = PrefixUpperBound(prefix);
  rocksdb::ReadOptions r;
  rocksdb::Slice upper(end);
  r.iterate_upper_bound = &upper;
  std::unique_ptr<rocksdb::Iterator> it(
      impl_->db->NewIterator(r, impl_->cfs[kManifests]));
  // The token is the last id of the previous page; ids sort as keys do.
  const std::string start =
      page_token.empty() ? prefix : SessionKey(tenant, page_token);
  SessionListPage page;
  for (it->Seek(start); it->Valid(); it->Next()) {
    if (!page_token.empty() && it->key() == rocksdb::Slice(start)) continue;
    if (static_cast<int64_t>(page.sessions.size()) == page_size) {
      page.next_page_token = page.sessions.back().session_id();
      break;
    }
    v1::SessionManifest m;
    if (!m.ParseFromArray(it->value().data(),
                          static_cast<int>(it->value().size()))) {
      return absl::DataLossError(absl::StrCat(
          "manifest ", it->key().ToString(), " in ", impl_->options.path,
          " does not parse; delete that session"));
    }
    if (IsReplica(m)) continue;  // not a live session of this node
    page.sessions.push_back(std::move(m));
  }
  KVD_RETURN_IF_ERROR(impl_->FromRocks(it->status(), "listing sessions"));
  return page;
}

absl::Status SessionDb::DeleteSession(absl::string_view tenant,
                                      absl::string_view session) {
  KVD_RETURN_IF_ERROR(ValidateName("tenant", tenant));
  KVD_RETURN_IF_ERROR(ValidateName("session id", session));
  const std::string prefix = ChunkPrefix(tenant, session);
  const std::string end = PrefixUpperBound(prefix);
  {
    absl::ReaderMutexLock commit(&impl_->commit_mu);
    std::string value;
    rocksdb::Status s =
        impl_->db->Get(rocksdb::ReadOptions(), impl_->cfs[kManifests],
                       SessionKey(tenant, session), &value);
    if (s.IsNotFound()) {
      return absl::NotFoundError(
          absl::StrCat("tenant ", tenant, " has no stored session ", session));
    }
    KVD_RETURN_IF_ERROR(impl_->FromRocks(s, "reading a manifest to delete"));
    v1::SessionManifest old;
    const int64_t old_bytes =
        old.ParseFromString(value) ? old.stored_bytes() : 0;
    rocksdb::WriteBatch batch;
    batch.Delete(impl_->cfs[kManifests], SessionKey(tenant, session));
    batch.DeleteRange(impl_->cfs[kTokens], prefix, end);
    batch.DeleteRange(impl_->cfs[kResiduals], prefix, end);
    // No free-space check: deleting is how a full disk gets its space back,
    // and the reserve keeps room for it. A RocksDB stopped by a full disk
    // refuses this write too, and the error says how much to free.
    (void)impl_->MaybeResume();
    s = impl_->db->Write(impl_->WriteOpts(), &batch);
    KVD_RETURN_IF_ERROR(impl_->FromRocks(
        s, absl::StrCat("deleting session ", Name(tenant, session))));
    impl_->Unreserve(std::string(tenant), old_bytes);
  }
  if (!impl_->CheckRoom(0, "").ok()) {
    // Short of space: compact the session's keys away now (outside the
    // commit lock, beside automatic compactions), so table space and the
    // blob files that held only deleted rows are freed, instead of waiting
    // for a compaction that may need the space first. No blob garbage
    // collection here: it would copy live rows into new files, which needs
    // the very space that is missing.
    rocksdb::CompactRangeOptions compact;
    compact.exclusive_manual_compaction = false;
    compact.blob_garbage_collection_policy =
        rocksdb::BlobGarbageCollectionPolicy::kDisable;
    compact.bottommost_level_compaction =
        rocksdb::BottommostLevelCompaction::kForce;
    const rocksdb::Slice begin_key(prefix), end_key(end);
    for (Cf cf : {kTokens, kResiduals}) {
      rocksdb::Status c = impl_->db->CompactRange(compact, impl_->cfs[cf],
                                                  &begin_key, &end_key);
      if (!c.ok()) break;  // the delete is committed; space comes later
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SweepStats> SessionDb::SweepOrphans() {
  absl::WriterMutexLock commit(&impl_->commit_mu);
  SweepStats stats;
  rocksdb::WriteBatch batch;
  std::set<std::string> sessions;
  for (Cf cf : {kTokens, kResiduals}) {
    std::unique_ptr<rocksdb::Iterator> it(
        impl_->db->NewIterator(rocksdb::ReadOptions(), impl_->cfs[cf]));
    std::string session_prefix;
    std::optional<v1::SessionManifest> manifest;
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      const absl::string_view k(it->key().data(), it->key().size());
      auto key = ParseChunkKey(k);
      if (!key) {
        batch.Delete(impl_->cfs[cf], it->key());
        ++stats.orphan_chunks_deleted;
        continue;
      }
      if (key->prefix != session_prefix) {
        session_prefix = std::string(key->prefix);
        sessions.insert(session_prefix);
        auto m = impl_->ReadManifest(key->tenant, key->session);
        // A damaged manifest is left for Load to report, never swept.
        if (!m.ok()) {
          manifest = v1::SessionManifest();
          manifest->set_token_count(-1);
        } else {
          manifest = *std::move(m);
        }
      }
      bool orphan = true;
      if (manifest && manifest->token_count() < 0) {
        orphan = false;
      } else if (manifest) {
        const int64_t c = manifest->chunk_tokens();
        if (key->id.layer == kTokenLayer) {
          orphan = key->id.index >= CeilDiv(manifest->token_count(), c);
        } else {
          for (int l = 0; l < manifest->layers_size(); ++l) {
            if (manifest->layers(l) != key->id.layer) continue;
            orphan = key->id.index < manifest->first_position(l) / c ||
                     key->id.index >= CeilDiv(manifest->length(), c);
          }
        }
      }
      if (orphan) {
        batch.Delete(impl_->cfs[cf], it->key());
        ++stats.orphan_chunks_deleted;
      }
    }
    KVD_RETURN_IF_ERROR(impl_->FromRocks(it->status(), "sweeping chunks"));
  }
  stats.sessions_checked = static_cast<int64_t>(sessions.size());
  if (batch.Count() > 0) {
    KVD_RETURN_IF_ERROR(impl_->FromRocks(
        impl_->db->Write(impl_->WriteOpts(), &batch), "deleting orphans"));
  }
  return stats;
}

absl::Status SessionDb::Flush() {
  rocksdb::FlushOptions f;
  f.wait = true;
  return impl_->FromRocks(impl_->db->Flush(f, impl_->cfs), "flushing");
}

int64_t SessionDb::TenantBytes(absl::string_view tenant) const {
  absl::MutexLock lock(&impl_->mu);
  auto it = impl_->tenant_bytes.find(std::string(tenant));
  return it == impl_->tenant_bytes.end() ? 0 : it->second;
}

int64_t SessionDb::QuotaBytes(absl::string_view tenant) const {
  return impl_->QuotaOf(std::string(tenant));
}

std::vector<std::string> SessionDb::Tenants() const {
  std::vector<std::string> tenants;
  absl::MutexLock lock(&impl_->mu);
  for (const auto& [tenant, bytes] : impl_->tenant_bytes) {
    tenants.push_back(tenant);
  }
  std::sort(tenants.begin(), tenants.end());
  return tenants;
}

absl::Status SessionDb::WriteHealth() {
  {
    absl::MutexLock lock(&impl_->mu);
    if (!impl_->write_failure.ok()) return impl_->write_failure;
  }
  KVD_RETURN_IF_ERROR(impl_->MaybeResume());
  // Not merely above the reserve: a node that would refuse its next typical
  // turn is not ready for session traffic.
  return impl_->CheckRoom(impl_->TypicalTurnBytes(), "", /*typical=*/true);
}

int64_t SessionDb::DiskBytes() const {
  std::error_code ec;
  int64_t total = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(impl_->options.path, ec)) {
    std::error_code size_ec;
    if (!entry.is_regular_file(size_ec)) continue;
    const auto size = entry.file_size(size_ec);
    if (!size_ec) total += static_cast<int64_t>(size);
  }
  return total;
}

}  // namespace kvd::storage
