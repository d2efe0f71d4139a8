// The RocksDB tier: one database per node holding every session checkpoint
// at rest (DESIGN.md section 5).
//
// Layout: column family "manifests" (key = SessionKey), "tokens" and
// "residuals" (key = ChunkKey; residual values live in blob files so
// compaction does not rewrite tensors). Keys are
//   <tenant>/<session>/ + big-endian layer + big-endian chunk index
// so one session's chunks are a single prefix scan, in position order, and
// tenants never share a key. A turn (TurnUpdate) is one atomic WriteBatch;
// the manifest in it is the commit record, written with the WAL synced
// according to Durability.
//
//   SessionDbOptions opts;
//   opts.path = "/var/lib/kvd/sessions";
//   KVD_ASSIGN_OR_RETURN(std::unique_ptr<SessionDb> db, SessionDb::Open(opts));
//   KVD_RETURN_IF_ERROR(db->CommitTurn(update));
//   KVD_ASSIGN_OR_RETURN(SessionCheckpoint cp, db->Load("acme", "chat-1"));
//
// Thread-safety: all methods may be called concurrently. Commits to one
// session must be ordered by the caller (the engine serializes a session's
// turns).
#ifndef KVD_STORAGE_ROCKSDB_SESSION_DB_H_
#define KVD_STORAGE_ROCKSDB_SESSION_DB_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/kvd/v1/checkpoint.pb.h"
#include "storage/checkpoint/session_checkpoint.h"
#include "storage/rocksdb/disk_full.h"

namespace rocksdb {
class FileSystem;
}

namespace kvd::storage {

enum class Durability {
  kSync,  // WAL fsync'd before CommitTurn returns: survives power loss
  kWal,   // WAL written, not fsync'd: survives a process crash only
};

struct SessionDbOptions {
  std::string path;  // directory; created if missing
  Durability durability = Durability::kSync;
  int64_t block_cache_bytes = 64 << 20;
  // Cap on all column families' memtables together (RocksDB's
  // WriteBufferManager): with the block cache, what the database may hold
  // in memory. On a small disk it shrinks to a sixteenth of the disk (at
  // least 1 MiB), since a full disk must still hold one memtable's flush.
  int64_t memtable_bytes = 64 << 20;
  // Free space kept on the database's disk: a turn or an import that would
  // leave less is refused as a full disk (RESOURCE_EXHAUSTED; nothing is
  // written) before RocksDB itself runs out, so deleting sessions and
  // RocksDB's flushes and compactions, which give the space back, still
  // work, and turns resume by themselves once there is room. 0 = sized to
  // the disk: the memtable budget, at most an eighth of the disk.
  int64_t reserve_free_bytes = 0;
  // Test hook: the disk's size and free space; null = StatDiskSpace.
  std::function<absl::StatusOr<DiskSpace>(const std::string& path)> disk_space;
  // Residual chunks are stored uncompressed unless this is set (then ZSTD in
  // the blob files: about 19% fewer bytes for bf16 rows at roughly a third
  // less write/read throughput; LZ4 saves nothing). docs/BENCHMARKS.md has
  // the measurement behind the default.
  bool compress_residuals = false;
  // Background flush/compaction I/O limit (bytes/s); 0 = unlimited.
  int64_t background_bytes_per_sec = 64 << 20;
  // Per-tenant quota on stored payload bytes; tenants not listed get
  // default_quota_bytes (0 = unlimited).
  absl::flat_hash_map<std::string, int64_t> tenant_quota_bytes;
  int64_t default_quota_bytes = 0;
  // Test hook: a FileSystem wrapper (fault injection); null = the default.
  std::shared_ptr<rocksdb::FileSystem> file_system;
};

struct SessionListPage {
  std::vector<v1::SessionManifest> sessions;  // ordered by session id
  std::string next_page_token;                // empty on the last page
};

struct SweepStats {
  int64_t orphan_chunks_deleted = 0;  // chunks with no manifest or beyond it
  int64_t sessions_checked = 0;
};

class SessionDb {
 public:
  // Opens (creating if needed) the database. Errors name the path and say
  // what to do: not a directory, not writable, locked by another process,
  // written by an incompatible kvd (format marker in the default family).
  static absl::StatusOr<std::unique_ptr<SessionDb>> Open(
      const SessionDbOptions& options);
  ~SessionDb();

  // Writes one turn atomically (chunks put/erased + manifest). Validates the
  // manifest first (ValidateManifestForWrite) and every chunk in `put`
  // (it must decode and match its id and the manifest's row layout):
  // INVALID_ARGUMENT otherwise. RESOURCE_EXHAUSTED if the tenant's quota
  // would be exceeded or the disk is full, marked by MarkDiskFull, with what
  // to free (nothing written then): the disk counts as full below
  // reserve_free_bytes, and commits work again by themselves once there is
  // room (after a RocksDB write error too: RocksDB recovers on its own).
  // ABORTED if the stored manifest's fence refuses it (a stale epoch, another
  // owner, a replica copy: storage/checkpoint/ownership.h), nothing written.
  // UNAVAILABLE for other I/O errors. On success
  // the turn is durable per Durability. The manifest's stored_bytes is
  // trusted for quotas (the engine computes it).
  absl::Status CommitTurn(const TurnUpdate& update);
  // Replaces a whole session (import). Over an existing session: one atomic
  // batch that first deletes its keys. A new session is written in bounded
  // batches of chunks and then its manifest (the commit record), so an
  // import costs memory for one batch, not a copy of the session; until the
  // manifest lands nothing of it is visible, and a failure removes what was
  // written.
  absl::Status PutSession(const SessionCheckpoint& checkpoint);

  // NOT_FOUND if the tenant has no such session.
  absl::StatusOr<v1::SessionManifest> GetManifest(absl::string_view tenant,
                                                  absl::string_view session);

  enum class Parts { kAll, kManifestAndTokens };
  // Loads a session's checkpoint by prefix scan; every chunk is decoded and
  // checked (DecodeChunk) and chunks beyond the manifest's lengths are
  // ignored. DATA_LOSS names the tenant, session, layer and chunk index of
  // the first bad chunk, or a chunk the manifest needs but the DB lacks.
  // `observer`, if given, sees each stream as soon as it is read and checked
  // (LoadObserver's protocol), the token ids first, then layer by layer.
  absl::StatusOr<SessionCheckpoint> Load(absl::string_view tenant,
                                         absl::string_view session,
                                         Parts parts = Parts::kAll,
                                         LoadObserver* observer = nullptr);

  // What a salvage can still export of a session: the whole checkpoint, or,
  // when its residual chunks are damaged or gone (Load says DATA_LOSS), its
  // token ids alone (TokensOnly: the session re-prefills when resumed) with
  // `residuals_lost` saying what was lost. DATA_LOSS only when the token ids
  // cannot be read either.
  struct Salvaged {
    SessionCheckpoint checkpoint;
    absl::Status residuals_lost;  // OK: nothing was lost
  };
  absl::StatusOr<Salvaged> LoadForSalvage(absl::string_view tenant,
                                          absl::string_view session);

  // Live sessions of a tenant (replica copies are left out) ordered by id,
  // at most page_size (1..1000) per page, starting after page_token (an opaque
  // token from a previous page).
  absl::StatusOr<SessionListPage> ListSessions(absl::string_view tenant,
                                               absl::string_view page_token,
                                               int64_t page_size);

  // Removes the manifest and every chunk of the session in one batch.
  // NOT_FOUND if it does not exist. Works while turns are refused for a full
  // disk (the reserve is there for it); then it also compacts the session's
  // keys away so their space comes back.
  absl::Status DeleteSession(absl::string_view tenant,
                             absl::string_view session);

  // Deletes chunks that no manifest accounts for (left by an interrupted
  // import or a manual deletion): chunks of sessions without a manifest, of
  // layers the manifest does not list, or outside its positions. Chunks of a
  // session whose manifest is damaged are kept (Load reports it). Blocks
  // commits while it runs.
  absl::StatusOr<SweepStats> SweepOrphans();

  // Stored payload bytes of a tenant (sum of its manifests' stored_bytes,
  // plus any commit's reservation while it is being written): what
  // QuotaBytes limits. Rebuilt from the manifests at Open.
  int64_t TenantBytes(absl::string_view tenant) const;
  // Every tenant with stored sessions (read from the manifests at Open),
  // sorted: what a salvage walks.
  std::vector<std::string> Tenants() const;
  // The tenant's quota on TenantBytes (SessionDbOptions), 0 = unlimited.
  // A tier above this one (TieredStore's kMemory commits) checks its own
  // not-yet-written bytes against it before acknowledging a turn.
  int64_t QuotaBytes(absl::string_view tenant) const;

  // Writes the memtables out to tables and blob files and waits: afterwards
  // the write-ahead log holds nothing the files do not.
  absl::Status Flush();

  // Bytes of the database directory's files (SST, blob, WAL): what the
  // process actually occupies on disk.
  int64_t DiskBytes() const;

  // Why turns cannot commit now, with what to do; OK when they can.
  // DATA_LOSS while RocksDB refuses writes because it found a damaged file
  // (as the last commit reported); RESOURCE_EXHAUSTED marked MarkDiskFull
  // while a typical turn (the median batch of the last 16 commits that stored
  // tokens, refused ones included) would take the disk below its reserve, or
  // RocksDB is recovering from a full disk. Readiness checks use it: such a
  // node can serve reads, not turns.
  absl::Status WriteHealth();

  SessionDb(const SessionDb&) = delete;
  SessionDb& operator=(const SessionDb&) = delete;

 private:
  absl::Status PutNewSession(const SessionCheckpoint& checkpoint);
  struct Impl;
  explicit SessionDb(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvd::storage

#endif  // KVD_STORAGE_ROCKSDB_SESSION_DB_H_
