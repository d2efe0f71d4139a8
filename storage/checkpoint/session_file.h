// Export/import of one session as a single self-describing file (DESIGN.md
// section 5): what `kvd sessions export` writes and the gRPC ExportSession
// streams, and what an import reads back on any node.
//
// Layout (integers little-endian, fixed width):
//   "KVDSESS\0"                      8-byte magic
//   u32 file version                 kSessionFileVersion
//   u32 checkpoint format version    kCheckpointFormatVersion (codec.h)
//   u64 n, n bytes                   SessionManifest (serialized proto)
//   per chunk, in (layer, index) order:
//     u8 'C', i64 layer, i64 index, u64 n, n bytes (an encoded chunk value,
//     which carries its own CRC32C; codec.h)
//   trailer: u8 'E', u64 chunk count,
//            u32 CRC32C of every byte of the file before this field
// and nothing after it.
//
// Reading checks all of it: magic, both versions (another version is refused
// with FAILED_PRECONDITION and a message saying which kvd wrote it), the
// manifest (ValidateManifest), every chunk (DecodeChunk, and that its header
// names the id it is filed under), that the chunks are exactly those the
// manifest implies (token chunks up to token_count, each checkpointed
// layer's chunks from its first_position up to length), the trailer's count
// and checksum, and that the input ends there. Lengths read from the input
// are bounded and never allocated before the bytes arrive, so a hostile or
// truncated file costs no more memory than its size.
//
//   KVD_RETURN_IF_ERROR(WriteSessionFile(checkpoint, "/tmp/chat-1.kvds"));
//   KVD_ASSIGN_OR_RETURN(SessionCheckpoint back,
//                        ReadSessionFile("/tmp/chat-1.kvds"));
//
// Thread-safety: free functions without shared state.
#ifndef KVD_STORAGE_CHECKPOINT_SESSION_FILE_H_
#define KVD_STORAGE_CHECKPOINT_SESSION_FILE_H_

#include <cstdint>
#include <functional>
#include <istream>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "storage/checkpoint/session_checkpoint.h"

namespace kvd::storage {

// Version of the container layout above (not of the manifest or chunk
// encoding, which kCheckpointFormatVersion covers).
inline constexpr uint32_t kSessionFileVersion = 1;
inline constexpr absl::string_view kSessionFileMagic{"KVDSESS\0", 8};
// Bounds on lengths read from a file: a manifest is kilobytes, a chunk is
// C rows of one layer's residual (megabytes for the largest models).
inline constexpr uint64_t kMaxSessionFileManifestBytes = 16 << 20;
inline constexpr uint64_t kMaxSessionFileChunkBytes = uint64_t{1} << 30;

// Writes the file at `path` atomically: to a temporary file in the same
// directory, fsync'd, then renamed over `path` (and the directory fsync'd),
// so `path` never holds a partial file. INVALID_ARGUMENT if the checkpoint is
// empty or inconsistent (the same checks a read makes: nothing is written
// that could not be read back); UNAVAILABLE naming the path on I/O errors.
absl::Status WriteSessionFile(const SessionCheckpoint& checkpoint,
                              const std::string& path);
// The same bytes to a stream (gRPC export) or a string.
absl::Status WriteSessionStream(const SessionCheckpoint& checkpoint,
                                std::ostream& out);
absl::StatusOr<std::string> SerializeSessionFile(
    const SessionCheckpoint& checkpoint);
// The same bytes handed to `emit` in pieces of at most `piece_bytes` (a gRPC
// stream's messages) without building the whole file: memory beyond the
// checkpoint is one piece. CANCELLED once `emit` returns false.
absl::Status WriteSessionPieces(
    const SessionCheckpoint& checkpoint, size_t piece_bytes,
    const std::function<bool(absl::string_view piece)>& emit);

// Reads and checks a file written by WriteSessionFile. Errors name the file
// (or `where` for streams) and what is wrong: INVALID_ARGUMENT if it is not a
// kvd session file, FAILED_PRECONDITION for another file or checkpoint
// format version, DATA_LOSS if it is truncated, corrupt, or inconsistent;
// NOT_FOUND if `path` does not exist.
absl::StatusOr<SessionCheckpoint> ReadSessionFile(const std::string& path);
absl::StatusOr<SessionCheckpoint> ReadSessionStream(std::istream& in,
                                                    absl::string_view where);
absl::StatusOr<SessionCheckpoint> ParseSessionFile(absl::string_view bytes,
                                                   absl::string_view where);
// One turn's update (TurnUpdate) as the same kind of record stream, so a
// replica can be sent exactly a turn's delta: "KVDTURN\0", u32 stream
// version, u32 checkpoint format version, u8 ownership_change, the manifest
// (u64 n + bytes), 'C' chunk records as in the file, 'X' records (i64 layer,
// i64 index) for chunks no longer kept, then 'E', u64 record count and the
// CRC32C of everything before it. Reading checks every record (each chunk
// decodes, names its id and fits the manifest's layout) and the trailer: a
// stream cut or damaged anywhere is refused and nothing of it is applied
// (DATA_LOSS; a damaged magic or version reads as INVALID_ARGUMENT or
// FAILED_PRECONDITION). Record counts and sizes are bounded per record only:
// a caller caps the whole stream through `next` (as gRPC import caps a
// file). Whether the records make sense for the session they update (no
// duplicates, within its positions) is the applier's check.
inline constexpr absl::string_view kTurnStreamMagic{"KVDTURN\0", 8};
inline constexpr uint32_t kTurnStreamVersion = 1;
absl::Status WriteTurnUpdatePieces(
    const TurnUpdate& update, size_t piece_bytes,
    const std::function<bool(absl::string_view piece)>& emit);
absl::StatusOr<TurnUpdate> ReadTurnUpdatePieces(
    const std::function<bool(std::string* piece)>& next,
    absl::string_view where);

// Reads a file that arrives in pieces: `next` replaces *piece with the next
// one, or returns false at the end. Only the current piece is held beyond
// the checkpoint being built, so a streamed import never buffers the file.
absl::StatusOr<SessionCheckpoint> ReadSessionPieces(
    const std::function<bool(std::string* piece)>& next,
    absl::string_view where);

// The checks ReadSessionFile makes on a checkpoint's contents (manifest and
// chunk set; see above), for callers that assemble one by other means.
// `where` names it in messages. DATA_LOSS / FAILED_PRECONDITION as above.
absl::Status ValidateCheckpointContents(const SessionCheckpoint& checkpoint,
                                        absl::string_view where);

}  // namespace kvd::storage

#endif  // KVD_STORAGE_CHECKPOINT_SESSION_FILE_H_
