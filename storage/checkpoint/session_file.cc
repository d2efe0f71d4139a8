#include "storage/checkpoint/session_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "storage/checkpoint/codec.h"
#include "storage/checkpoint/crc32c.h"

namespace kvd::storage {
namespace {

constexpr char kChunkTag = 'C';
constexpr char kEndTag = 'E';
constexpr char kEraseTag = 'X';  // turn streams only: a chunk no longer kept
// Reads grow a buffer at most this much ahead of the bytes actually
// received, so a length field cannot make us allocate what is not there.
constexpr size_t kReadStepBytes = 1 << 20;

const char kReExport[] =
    "; the file is truncated or corrupt: export the session again";

std::string ChunkName(const ChunkId& id) {
  return id.layer == kTokenLayer
             ? absl::StrCat("token chunk ", id.index)
             : absl::StrCat("layer ", id.layer, " chunk ", id.index);
}

// ---- Writing ----

// Receives the file's bytes and keeps the running CRC32C of all of them.
class Sink {
 public:
  virtual ~Sink() = default;
  bool Append(absl::string_view bytes) {
    crc_ = Crc32cExtend(crc_, bytes.data(), bytes.size());
    return Write(bytes);
  }
  uint32_t crc() const { return crc_; }

 protected:
  virtual bool Write(absl::string_view bytes) = 0;

 private:
  uint32_t crc_ = 0;
};

class StringSink : public Sink {
 public:
  explicit StringSink(std::string* out) : out_(out) {}

 protected:
  bool Write(absl::string_view bytes) override {
    out_->append(bytes.data(), bytes.size());
    return true;
  }

 private:
  std::string* out_;
};

class StreamSink : public Sink {
 public:
  explicit StreamSink(std::ostream* out) : out_(out) {}

 protected:
  bool Write(absl::string_view bytes) override {
    out_->write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return out_->good();
  }

 private:
  std::ostream* out_;
};

class FdSink : public Sink {
 public:
  explicit FdSink(int fd) : fd_(fd) {}
  int error() const { return errno_; }

 protected:
  bool Write(absl::string_view bytes) override {
    while (!bytes.empty()) {
      const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        errno_ = errno;
        return false;
      }
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

 private:
  int fd_;
  int errno_ = 0;
};

// Hands the file on in pieces of at most `piece_bytes` (a gRPC stream's
// messages), holding one piece at a time.
class PieceSink : public Sink {
 public:
  PieceSink(size_t piece_bytes,
            const std::function<bool(absl::string_view)>& emit)
      : piece_bytes_(std::max<size_t>(piece_bytes, 1)), emit_(emit) {}
  bool Finish() { return piece_.empty() || Emit(); }

 protected:
  bool Write(absl::string_view bytes) override {
    while (!bytes.empty()) {
      const size_t take = std::min(bytes.size(), piece_bytes_ - piece_.size());
      piece_.append(bytes.data(), take);
      bytes.remove_prefix(take);
      if (piece_.size() == piece_bytes_ && !Emit()) return false;
    }
    return true;
  }

 private:
  bool Emit() {
    const bool ok = emit_(piece_);
    piece_.clear();
    return ok;
  }
  const size_t piece_bytes_;
  const std::function<bool(absl::string_view)>& emit_;
  std::string piece_;
};

template <typename T>
std::string LittleEndian(T v) {
  std::string out(sizeof(T), '\0');
  auto u = static_cast<std::make_unsigned_t<T>>(v);
  for (size_t i = 0; i < sizeof(T); ++i) {
    out[i] = static_cast<char>((u >> (8 * i)) & 0xFF);
  }
  return out;
}

// Writes the whole file to `sink`; false on the first failed write.
bool Emit(const SessionCheckpoint& cp, Sink& sink) {
  const std::string manifest = cp.manifest().SerializeAsString();
  if (!sink.Append(kSessionFileMagic) ||
      !sink.Append(LittleEndian<uint32_t>(kSessionFileVersion)) ||
      // The manifest's own version: a session stored by an older kvd is
      // exported as it is, and reads back as it was.
      !sink.Append(LittleEndian<uint32_t>(cp.manifest().format_version())) ||
      !sink.Append(LittleEndian<uint64_t>(manifest.size())) ||
      !sink.Append(manifest)) {
    return false;
  }
  for (const auto& [id, value] : cp.chunks()) {
    const std::string head = absl::StrCat(
        absl::string_view(&kChunkTag, 1), LittleEndian<int64_t>(id.layer),
        LittleEndian<int64_t>(id.index), LittleEndian<uint64_t>(value.size()));
    if (!sink.Append(head) || !sink.Append(value)) return false;
  }
  if (!sink.Append(absl::StrCat(absl::string_view(&kEndTag, 1),
                                LittleEndian<uint64_t>(cp.chunks().size())))) {
    return false;
  }
  return sink.Append(LittleEndian<uint32_t>(sink.crc()));
}

absl::Status CheckWritable(const SessionCheckpoint& cp) {
  if (cp.empty()) {
    return absl::InvalidArgumentError(
        "cannot export an empty session checkpoint (no manifest)");
  }
  const std::string where = absl::StrCat("session ", cp.manifest().tenant(),
                                         "/", cp.manifest().session_id());
  absl::Status s = ValidateCheckpointContents(cp, where);
  if (!s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "refusing to export an inconsistent checkpoint: ", s.message()));
  }
  return absl::OkStatus();
}

std::string ErrnoText(int err) { return std::strerror(err); }

// ---- Reading ----

// Delivers the file's bytes in order and keeps the CRC32C of those consumed.
class Source {
 public:
  virtual ~Source() = default;
  // Appends exactly n bytes to *out; false if the input ends first.
  bool Read(uint64_t n, std::string* out) {
    const size_t before = out->size();
    if (!ReadInto(n, out)) return false;
    crc_ = Crc32cExtend(crc_, out->data() + before, out->size() - before);
    consumed_ += n;
    return true;
  }
  // True if no byte is left.
  virtual bool AtEnd() = 0;
  uint32_t crc() const { return crc_; }
  uint64_t consumed() const { return consumed_; }

 protected:
  virtual bool ReadInto(uint64_t n, std::string* out) = 0;

 private:
  uint32_t crc_ = 0;
  uint64_t consumed_ = 0;
};

class StringSource : public Source {
 public:
  explicit StringSource(absl::string_view in) : in_(in) {}
  bool AtEnd() override { return in_.empty(); }

 protected:
  bool ReadInto(uint64_t n, std::string* out) override {
    if (n > in_.size()) return false;
    out->append(in_.data(), n);
    in_.remove_prefix(n);
    return true;
  }

 private:
  absl::string_view in_;
};

class StreamSource : public Source {
 public:
  explicit StreamSource(std::istream* in) : in_(in) {}
  bool AtEnd() override { return in_->peek() == std::char_traits<char>::eof(); }

 protected:
  bool ReadInto(uint64_t n, std::string* out) override {
    while (n > 0) {
      const size_t step =
          static_cast<size_t>(std::min<uint64_t>(n, kReadStepBytes));
      const size_t at = out->size();
      out->resize(at + step);
      in_->read(out->data() + at, static_cast<std::streamsize>(step));
      if (static_cast<size_t>(in_->gcount()) != step) return false;
      n -= step;
    }
    return true;
  }

 private:
  std::istream* in_;
};

// Pulls the file's bytes piece by piece from `next` (a gRPC stream's
// messages), holding only the current piece.
class PieceSource : public Source {
 public:
  explicit PieceSource(const std::function<bool(std::string*)>& next)
      : next_(next) {}
  bool AtEnd() override { return !Fill(); }

 protected:
  bool ReadInto(uint64_t n, std::string* out) override {
    while (n > 0) {
      if (!Fill()) return false;
      const size_t take =
          static_cast<size_t>(std::min<uint64_t>(n, piece_.size() - at_));
      out->append(piece_.data() + at_, take);
      at_ += take;
      n -= take;
    }
    return true;
  }

 private:
  // True when unread bytes are at hand.
  bool Fill() {
    while (at_ == piece_.size()) {
      if (done_) return false;
      piece_.clear();
      at_ = 0;
      if (!next_(&piece_)) {
        done_ = true;
        piece_.clear();
        return false;
      }
    }
    return true;
  }
  const std::function<bool(std::string*)>& next_;
  std::string piece_;
  size_t at_ = 0;
  bool done_ = false;
};

template <typename T>
T FromLittleEndian(absl::string_view bytes) {
  std::make_unsigned_t<T> u = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    u |= static_cast<std::make_unsigned_t<T>>(static_cast<uint8_t>(bytes[i]))
         << (8 * i);
  }
  return static_cast<T>(u);
}

// Reads the records both streams share: a header's versions, the manifest,
// chunk records ('C'; erase records 'X' where allowed), and the trailer
// (record count and the CRC32C of every byte before it). Lengths are
// checked before anything is allocated; `suffix` ends every DATA_LOSS
// message (what the reader should do).
class RecordReader {
 public:
  RecordReader(Source* src, absl::string_view where, absl::string_view suffix)
      : src_(src), where_(where), suffix_(suffix) {}

  template <typename T>
  bool ReadInt(T* v) {
    std::string bytes;
    if (!src_->Read(sizeof(T), &bytes)) return false;
    *v = FromLittleEndian<T>(bytes);
    return true;
  }
  Source* src() { return src_; }
  const std::string& where() const { return where_; }

  absl::Status Truncated(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat(where_, " ends inside ", what,
                                            " (after ", src_->consumed(),
                                            " bytes)", suffix_));
  }
  absl::Status Corrupt(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat(where_, ": ", what, suffix_));
  }

  // The u64-length-prefixed manifest, which must be of `format_version`.
  absl::StatusOr<v1::SessionManifest> ReadManifest(uint32_t format_version) {
    uint64_t manifest_bytes = 0;
    if (!ReadInt(&manifest_bytes)) return Truncated("the manifest length");
    if (manifest_bytes > kMaxSessionFileManifestBytes) {
      return Corrupt(absl::StrCat("manifest length ", manifest_bytes,
                                  " exceeds the limit ",
                                  kMaxSessionFileManifestBytes));
    }
    std::string manifest_data;
    if (!src_->Read(manifest_bytes, &manifest_data)) {
      return Truncated("the manifest");
    }
    v1::SessionManifest manifest;
    if (!manifest.ParseFromString(manifest_data)) {
      return Corrupt("the manifest does not parse");
    }
    if (manifest.format_version() != format_version) {
      return Corrupt(absl::StrCat("the header says checkpoint format version ",
                                  format_version, " but the manifest says ",
                                  manifest.format_version()));
    }
    return manifest;
  }

  // Records up to the end tag, in order; then the trailer. Chunk ids must
  // strictly increase (each chunk once); erase records only when `on_erase`
  // is given.
  absl::Status ReadRecords(
      const std::function<void(const ChunkId&, std::string)>& on_chunk,
      const std::function<void(const ChunkId&)>& on_erase) {
    uint64_t records = 0;
    std::optional<ChunkId> last;
    while (true) {
      std::string tag;
      if (!src_->Read(1, &tag)) return Truncated("a record or the trailer");
      if (tag[0] == kEndTag) break;
      const bool erase = tag[0] == kEraseTag && on_erase;
      if (tag[0] != kChunkTag && !erase) {
        return Corrupt(absl::StrCat("unknown record tag 0x",
                                    absl::Hex(static_cast<uint8_t>(tag[0])),
                                    " at byte ", src_->consumed() - 1));
      }
      ChunkId id;
      if (!ReadInt(&id.layer) || !ReadInt(&id.index)) {
        return Truncated("a record header");
      }
      ++records;
      if (erase) {
        on_erase(id);
        continue;
      }
      uint64_t value_bytes = 0;
      if (!ReadInt(&value_bytes)) return Truncated("a chunk record header");
      if (value_bytes > kMaxSessionFileChunkBytes) {
        return Corrupt(absl::StrCat(ChunkName(id), " claims ", value_bytes,
                                    " bytes, over the limit ",
                                    kMaxSessionFileChunkBytes));
      }
      if (last.has_value() && !(*last < id)) {
        return Corrupt(
            absl::StrCat(ChunkName(id), " is duplicated or out of order"));
      }
      last = id;
      std::string value;
      if (!src_->Read(value_bytes, &value)) return Truncated(ChunkName(id));
      on_chunk(id, std::move(value));
    }
    uint64_t count = 0;
    if (!ReadInt(&count)) return Truncated("the trailer");
    const uint32_t want_crc = src_->crc();
    uint32_t crc = 0;
    if (!ReadInt(&crc)) return Truncated("the trailer checksum");
    if (count != records) {
      return Corrupt(absl::StrCat("the trailer counts ", count,
                                  " records but the stream holds ", records));
    }
    if (crc != want_crc) {
      return Corrupt(absl::StrCat("CRC32C is ", absl::Hex(want_crc),
                                  " but the trailer says ", absl::Hex(crc)));
    }
    if (!src_->AtEnd()) {
      return Corrupt(absl::StrCat("unexpected bytes after the trailer (byte ",
                                  src_->consumed(), " on)"));
    }
    return absl::OkStatus();
  }

 private:
  Source* src_;
  std::string where_;
  std::string suffix_;
};

absl::StatusOr<SessionCheckpoint> ParseSession(Source* src,
                                               absl::string_view where) {
  RecordReader r(src, where, kReExport);
  std::string magic;
  if (!src->Read(kSessionFileMagic.size(), &magic)) {
    return r.Truncated("the file header");
  }
  if (magic != kSessionFileMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is not a kvd session file (it starts with \"",
                     absl::CHexEscape(magic), "\", not \"",
                     absl::CHexEscape(kSessionFileMagic),
                     "\"); pass a file written by `kvd sessions export`"));
  }
  uint32_t file_version = 0, format_version = 0;
  if (!r.ReadInt(&file_version) || !r.ReadInt(&format_version)) {
    return r.Truncated("the file header");
  }
  if (file_version != kSessionFileVersion ||
      format_version < kOldestCheckpointFormatVersion ||
      format_version > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, " has session file version ", file_version,
        " and checkpoint format version ", format_version,
        " but this kvd reads file version ", kSessionFileVersion,
        " with checkpoint format versions ", kOldestCheckpointFormatVersion,
        " to ", kCheckpointFormatVersion,
        "; import it with the kvd release that exported it"));
  }
  absl::StatusOr<v1::SessionManifest> manifest = r.ReadManifest(format_version);
  if (!manifest.ok()) return manifest.status();
  std::map<ChunkId, std::string> chunks;
  absl::Status records = r.ReadRecords(
      [&chunks](const ChunkId& id, std::string value) {
        chunks.emplace_hint(chunks.end(), id, std::move(value));
      },
      nullptr);
  if (!records.ok()) return records;
  SessionCheckpoint cp;
  cp.Reset(*std::move(manifest), std::move(chunks));
  absl::Status s = ValidateCheckpointContents(cp, where);
  if (!s.ok()) return s;
  return cp;
}

// Rows a chunk at `index` holds when a stream has `count` rows.
int64_t RowsAt(int64_t index, int64_t chunk_tokens, int64_t count) {
  return std::min(chunk_tokens, count - index * chunk_tokens);
}

int64_t ChunksFor(int64_t count, int64_t chunk_tokens) {
  return (count + chunk_tokens - 1) / chunk_tokens;
}

}  // namespace

absl::Status ValidateCheckpointContents(const SessionCheckpoint& cp,
                                        absl::string_view where) {
  const v1::SessionManifest& m = cp.manifest();
  absl::Status valid = ValidateManifest(m);
  if (!valid.ok()) {
    return absl::Status(valid.code(),
                        absl::StrCat(where, ": ", valid.message()));
  }
  const int64_t c = m.chunk_tokens();
  // The chunk set the manifest implies, with each chunk's expected rows.
  std::map<ChunkId, int64_t> expected;
  for (int64_t i = 0; i < ChunksFor(m.token_count(), c); ++i) {
    expected[ChunkId{kTokenLayer, i}] = RowsAt(i, c, m.token_count());
  }
  for (int j = 0; j < m.layers_size(); ++j) {
    for (int64_t i = m.first_position(j) / c; i < ChunksFor(m.length(), c);
         ++i) {
      expected[ChunkId{m.layers(j), i}] = RowsAt(i, c, m.length());
    }
  }
  auto bad = [&](const ChunkId& id, absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat(where, ": ", ChunkName(id), " ", what, kReExport));
  };
  int64_t payload_bytes = 0;
  for (const auto& [id, value] : cp.chunks()) {
    auto it = expected.find(id);
    if (it == expected.end()) {
      return bad(id, absl::StrCat("is not part of the manifest (",
                                  m.token_count(), " tokens, length ",
                                  m.length(), ", chunk_tokens ", c, ")"));
    }
    auto decoded = DecodeChunk(value, absl::StrCat(where, " ", ChunkName(id)));
    if (!decoded.ok()) return decoded.status();
    const v1::ChunkHeader& h = decoded->header;
    if (h.layer() != id.layer || h.chunk_index() != id.index ||
        h.first_position() != id.index * c) {
      return bad(id, absl::StrCat("holds the header of layer ", h.layer(),
                                  " chunk ", h.chunk_index(), " at position ",
                                  h.first_position()));
    }
    if (h.rows() != it->second) {
      return bad(id, absl::StrCat("has ", h.rows(),
                                  " rows but the manifest "
                                  "implies ",
                                  it->second));
    }
    if (id.layer != kTokenLayer &&
        (h.dtype() != m.dtype() || h.row_bytes() != m.row_bytes())) {
      return bad(id,
                 absl::StrCat("rows are ", v1::DType_Name(h.dtype()), " x ",
                              h.row_bytes(), " bytes but the manifest says ",
                              v1::DType_Name(m.dtype()), " x ", m.row_bytes()));
    }
    payload_bytes += static_cast<int64_t>(decoded->payload.size());
    expected.erase(it);
  }
  if (!expected.empty()) {
    return bad(expected.begin()->first,
               absl::StrCat("is missing (", expected.size(),
                            " chunks the manifest needs are absent)"));
  }
  // Quotas trust stored_bytes, so an edited file must not misstate it.
  if (m.stored_bytes() != payload_bytes) {
    return absl::DataLossError(absl::StrCat(
        where, ": the manifest says ", m.stored_bytes(),
        " stored bytes but its chunks hold ", payload_bytes, kReExport));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SerializeSessionFile(const SessionCheckpoint& cp) {
  absl::Status s = CheckWritable(cp);
  if (!s.ok()) return s;
  std::string out;
  StringSink sink(&out);
  Emit(cp, sink);
  return out;
}

absl::Status WriteSessionStream(const SessionCheckpoint& cp,
                                std::ostream& out) {
  absl::Status s = CheckWritable(cp);
  if (!s.ok()) return s;
  StreamSink sink(&out);
  if (!Emit(cp, sink) || !out.flush()) {
    return absl::UnavailableError(
        "writing the session file to the output stream failed");
  }
  return absl::OkStatus();
}

absl::Status WriteSessionPieces(
    const SessionCheckpoint& cp, size_t piece_bytes,
    const std::function<bool(absl::string_view piece)>& emit) {
  absl::Status s = CheckWritable(cp);
  if (!s.ok()) return s;
  PieceSink sink(piece_bytes, emit);
  if (!Emit(cp, sink) || !sink.Finish()) {
    return absl::CancelledError("the receiver of the session file went away");
  }
  return absl::OkStatus();
}

absl::Status WriteTurnUpdatePieces(
    const TurnUpdate& update, size_t piece_bytes,
    const std::function<bool(absl::string_view piece)>& emit) {
  KVD_RETURN_IF_ERROR(ValidateManifestForWrite(update.manifest));
  PieceSink sink(piece_bytes, emit);
  const std::string manifest = update.manifest.SerializeAsString();
  bool ok =
      sink.Append(kTurnStreamMagic) &&
      sink.Append(LittleEndian<uint32_t>(kTurnStreamVersion)) &&
      sink.Append(LittleEndian<uint32_t>(update.manifest.format_version())) &&
      sink.Append(LittleEndian<uint8_t>(update.ownership_change)) &&
      sink.Append(LittleEndian<uint64_t>(manifest.size())) &&
      sink.Append(manifest);
  // In id order, as the reader requires (each chunk once).
  std::vector<const std::pair<ChunkId, std::string>*> puts;
  for (const auto& put : update.put) puts.push_back(&put);
  std::sort(puts.begin(), puts.end(),
            [](const auto* a, const auto* b) { return a->first < b->first; });
  for (const auto* put : puts) {
    const auto& [id, value] = *put;
    ok = ok &&
         sink.Append(absl::StrCat(absl::string_view(&kChunkTag, 1),
                                  LittleEndian<int64_t>(id.layer),
                                  LittleEndian<int64_t>(id.index),
                                  LittleEndian<uint64_t>(value.size()))) &&
         sink.Append(value);
  }
  for (const ChunkId& id : update.erase) {
    ok = ok && sink.Append(absl::StrCat(absl::string_view(&kEraseTag, 1),
                                        LittleEndian<int64_t>(id.layer),
                                        LittleEndian<int64_t>(id.index)));
  }
  ok = ok &&
       sink.Append(absl::StrCat(
           absl::string_view(&kEndTag, 1),
           LittleEndian<uint64_t>(update.put.size() + update.erase.size()))) &&
       sink.Append(LittleEndian<uint32_t>(sink.crc())) && sink.Finish();
  if (!ok) {
    return absl::CancelledError("the receiver of the turn update went away");
  }
  return absl::OkStatus();
}

absl::Status WriteSessionFile(const SessionCheckpoint& cp,
                              const std::string& path) {
  absl::Status s = CheckWritable(cp);
  if (!s.ok()) return s;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos
                              ? "."
                              : path.substr(0, std::max<size_t>(slash, 1));
  // Unique per process and call, so concurrent exports never share a file.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp =
      absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", tmp, " to export session ",
                     cp.manifest().session_id(), ": ", ErrnoText(errno),
                     "; check that the directory exists and is writable"));
  }
  FdSink sink(fd);
  const bool wrote = Emit(cp, sink);
  int err = wrote ? 0 : sink.error();
  if (wrote && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return absl::UnavailableError(
        absl::StrCat("writing session file ", path, " failed: ", ErrnoText(err),
                     "; nothing was written under that name"));
  }
  // The rename is durable only once the directory entry is.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    const int rc = ::fsync(dir_fd);
    err = rc == 0 ? 0 : errno;
    ::close(dir_fd);
    if (rc != 0) {
      return absl::UnavailableError(absl::StrCat(
          "session file ", path, " was written but syncing directory ", dir,
          " failed: ", ErrnoText(err)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SessionCheckpoint> ParseSessionFile(absl::string_view bytes,
                                                   absl::string_view where) {
  StringSource src(bytes);
  return ParseSession(&src, where);
}

absl::StatusOr<SessionCheckpoint> ReadSessionStream(std::istream& in,
                                                    absl::string_view where) {
  StreamSource src(&in);
  return ParseSession(&src, where);
}

absl::StatusOr<SessionCheckpoint> ReadSessionPieces(
    const std::function<bool(std::string* piece)>& next,
    absl::string_view where) {
  PieceSource src(next);
  return ParseSession(&src, where);
}

absl::StatusOr<TurnUpdate> ReadTurnUpdatePieces(
    const std::function<bool(std::string* piece)>& next,
    absl::string_view where) {
  PieceSource src(next);
  RecordReader r(&src, where, "; nothing of it was applied");
  std::string magic;
  if (!src.Read(kTurnStreamMagic.size(), &magic)) {
    return r.Truncated("the header");
  }
  if (magic != kTurnStreamMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is not a kvd turn update stream"));
  }
  uint32_t version = 0, format_version = 0;
  uint8_t ownership = 0;
  if (!r.ReadInt(&version) || !r.ReadInt(&format_version) ||
      !r.ReadInt(&ownership)) {
    return r.Truncated("the header");
  }
  if (version != kTurnStreamVersion ||
      format_version < kOldestCheckpointFormatVersion ||
      format_version > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, " has turn stream version ", version, " and checkpoint format ",
        format_version, "; this kvd reads stream version ", kTurnStreamVersion,
        " with formats ", kOldestCheckpointFormatVersion, " to ",
        kCheckpointFormatVersion));
  }
  if (ownership > 1) return r.Corrupt("the ownership flag is not 0 or 1");
  TurnUpdate update;
  update.ownership_change = ownership == 1;
  KVD_ASSIGN_OR_RETURN(update.manifest, r.ReadManifest(format_version));
  if (absl::Status s = ValidateManifest(update.manifest); !s.ok()) {
    return r.Corrupt(s.message());
  }
  const v1::SessionManifest& m = update.manifest;
  absl::Status bad_chunk;
  KVD_RETURN_IF_ERROR(r.ReadRecords(
      [&](const ChunkId& id, std::string value) {
        if (!bad_chunk.ok()) return;
        absl::StatusOr<DecodedChunk> chunk = DecodeChunk(value, where);
        if (!chunk.ok()) {
          bad_chunk = chunk.status();
          return;
        }
        const v1::ChunkHeader& h = chunk->header;
        const bool residual = id.layer != kTokenLayer;
        if (h.layer() != id.layer || h.chunk_index() != id.index ||
            (residual &&
             (h.dtype() != m.dtype() || h.row_bytes() != m.row_bytes() ||
              std::find(m.layers().begin(), m.layers().end(), id.layer) ==
                  m.layers().end()))) {
          bad_chunk = r.Corrupt(absl::StrCat(
              ChunkName(id), " does not fit the update's manifest"));
          return;
        }
        update.put.emplace_back(id, std::move(value));
      },
      [&update](const ChunkId& id) { update.erase.push_back(id); }));
  KVD_RETURN_IF_ERROR(bad_chunk);
  return update;
}

absl::StatusOr<SessionCheckpoint> ReadSessionFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session file ", path, " is a directory; pass the exported file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    const int err = errno;
    const std::string what =
        absl::StrCat("cannot open session file ", path, ": ", ErrnoText(err));
    return err == ENOENT ? absl::NotFoundError(what)
                         : absl::InvalidArgumentError(what);
  }
  return ReadSessionStream(in, absl::StrCat("session file ", path));
}

}  // namespace kvd::storage
