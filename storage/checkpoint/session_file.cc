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

class Parser {
 public:
  Parser(Source* src, absl::string_view where) : src_(src), where_(where) {}

  absl::StatusOr<SessionCheckpoint> Parse() {
    std::string magic;
    if (!src_->Read(kSessionFileMagic.size(), &magic)) {
      return Truncated("the file header");
    }
    if (magic != kSessionFileMagic) {
      return absl::InvalidArgumentError(
          absl::StrCat(where_, " is not a kvd session file (it starts with \"",
                       absl::CHexEscape(magic), "\", not \"",
                       absl::CHexEscape(kSessionFileMagic),
                       "\"); pass a file written by `kvd sessions export`"));
    }
    uint32_t file_version = 0, format_version = 0;
    if (!ReadInt(&file_version) || !ReadInt(&format_version)) {
      return Truncated("the file header");
    }
    if (file_version != kSessionFileVersion ||
        format_version < kOldestCheckpointFormatVersion ||
        format_version > kCheckpointFormatVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          where_, " has session file version ", file_version,
          " and checkpoint format version ", format_version,
          " but this kvd reads file version ", kSessionFileVersion,
          " with checkpoint format versions ", kOldestCheckpointFormatVersion,
          " to ", kCheckpointFormatVersion,
          "; import it with the kvd release that exported it"));
    }
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
    std::map<ChunkId, std::string> chunks;
    while (true) {
      std::string tag;
      if (!src_->Read(1, &tag)) return Truncated("a chunk or the trailer");
      if (tag[0] == kEndTag) break;
      if (tag[0] != kChunkTag) {
        return Corrupt(absl::StrCat("unknown record tag 0x",
                                    absl::Hex(static_cast<uint8_t>(tag[0])),
                                    " at byte ", src_->consumed() - 1));
      }
      ChunkId id;
      uint64_t value_bytes = 0;
      if (!ReadInt(&id.layer) || !ReadInt(&id.index) ||
          !ReadInt(&value_bytes)) {
        return Truncated("a chunk record header");
      }
      if (value_bytes > kMaxSessionFileChunkBytes) {
        return Corrupt(absl::StrCat(ChunkName(id), " claims ", value_bytes,
                                    " bytes, over the limit ",
                                    kMaxSessionFileChunkBytes));
      }
      if (!chunks.empty() && !(chunks.rbegin()->first < id)) {
        return Corrupt(
            absl::StrCat(ChunkName(id), " is duplicated or out of order"));
      }
      std::string value;
      if (!src_->Read(value_bytes, &value)) {
        return Truncated(ChunkName(id));
      }
      chunks.emplace_hint(chunks.end(), id, std::move(value));
    }
    uint64_t count = 0;
    if (!ReadInt(&count)) return Truncated("the trailer");
    const uint32_t want_crc = src_->crc();
    uint32_t crc = 0;
    if (!ReadInt(&crc)) return Truncated("the trailer checksum");
    if (count != chunks.size()) {
      return Corrupt(absl::StrCat("the trailer counts ", count,
                                  " chunks but the file holds ",
                                  chunks.size()));
    }
    if (crc != want_crc) {
      return Corrupt(absl::StrCat("file CRC32C is ", absl::Hex(want_crc),
                                  " but the trailer says ", absl::Hex(crc)));
    }
    if (!src_->AtEnd()) {
      return Corrupt(absl::StrCat("unexpected bytes after the trailer (byte ",
                                  src_->consumed(), " on)"));
    }
    SessionCheckpoint cp;
    cp.Reset(std::move(manifest), std::move(chunks));
    absl::Status s = ValidateCheckpointContents(cp, where_);
    if (!s.ok()) return s;
    return cp;
  }

 private:
  template <typename T>
  bool ReadInt(T* v) {
    std::string bytes;
    if (!src_->Read(sizeof(T), &bytes)) return false;
    *v = FromLittleEndian<T>(bytes);
    return true;
  }

  absl::Status Truncated(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat(where_, " ends inside ", what,
                                            " (after ", src_->consumed(),
                                            " bytes)", kReExport));
  }
  absl::Status Corrupt(absl::string_view what) const {
    return absl::DataLossError(absl::StrCat(where_, ": ", what, kReExport));
  }

  Source* src_;
  std::string where_;
};

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
  for (const auto& [id, value] : update.put) {
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
  return Parser(&src, where).Parse();
}

absl::StatusOr<SessionCheckpoint> ReadSessionStream(std::istream& in,
                                                    absl::string_view where) {
  StreamSource src(&in);
  return Parser(&src, where).Parse();
}

absl::StatusOr<SessionCheckpoint> ReadSessionPieces(
    const std::function<bool(std::string* piece)>& next,
    absl::string_view where) {
  PieceSource src(next);
  return Parser(&src, where).Parse();
}

absl::StatusOr<TurnUpdate> ReadTurnUpdatePieces(
    const std::function<bool(std::string* piece)>& next,
    absl::string_view where) {
  PieceSource src(next);
  const std::string at(where);
  auto truncated = [&](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat(at, " ends inside ", what, " (after ", src.consumed(),
                     " bytes); nothing of it was applied"));
  };
  auto corrupt = [&](absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat(at, ": ", what, "; nothing of it was applied"));
  };
  auto read_int = [&](auto* v) {
    std::string bytes;
    if (!src.Read(sizeof(*v), &bytes)) return false;
    *v = FromLittleEndian<std::decay_t<decltype(*v)>>(bytes);
    return true;
  };
  std::string magic;
  if (!src.Read(kTurnStreamMagic.size(), &magic))
    return truncated("the header");
  if (magic != kTurnStreamMagic) {
    return absl::InvalidArgumentError(
        absl::StrCat(at, " is not a kvd turn update stream"));
  }
  uint32_t version = 0, format_version = 0;
  uint8_t ownership = 0;
  uint64_t manifest_bytes = 0;
  if (!read_int(&version) || !read_int(&format_version) ||
      !read_int(&ownership) || !read_int(&manifest_bytes)) {
    return truncated("the header");
  }
  if (version != kTurnStreamVersion ||
      format_version < kOldestCheckpointFormatVersion ||
      format_version > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        at, " has turn stream version ", version, " and checkpoint format ",
        format_version, "; this kvd reads stream version ", kTurnStreamVersion,
        " with formats ", kOldestCheckpointFormatVersion, " to ",
        kCheckpointFormatVersion));
  }
  if (ownership > 1) return corrupt("the ownership flag is not 0 or 1");
  if (manifest_bytes > kMaxSessionFileManifestBytes) {
    return corrupt(
        absl::StrCat("manifest length ", manifest_bytes, " exceeds the limit"));
  }
  std::string manifest_data;
  if (!src.Read(manifest_bytes, &manifest_data))
    return truncated("the manifest");
  TurnUpdate update;
  update.ownership_change = ownership == 1;
  if (!update.manifest.ParseFromString(manifest_data)) {
    return corrupt("the manifest does not parse");
  }
  if (update.manifest.format_version() != format_version) {
    return corrupt("the header and the manifest disagree on the format");
  }
  if (absl::Status s = ValidateManifest(update.manifest); !s.ok()) {
    return corrupt(s.message());
  }
  const v1::SessionManifest& m = update.manifest;
  uint64_t records = 0;
  for (;;) {
    std::string tag;
    if (!src.Read(1, &tag)) return truncated("a record or the trailer");
    if (tag[0] == kEndTag) break;
    ChunkId id;
    if (!read_int(&id.layer) || !read_int(&id.index)) {
      return truncated("a record header");
    }
    ++records;
    if (tag[0] == kEraseTag) {
      update.erase.push_back(id);
      continue;
    }
    if (tag[0] != kChunkTag) {
      return corrupt(absl::StrCat("unknown record tag 0x",
                                  absl::Hex(static_cast<uint8_t>(tag[0]))));
    }
    uint64_t value_bytes = 0;
    if (!read_int(&value_bytes)) return truncated("a chunk record header");
    if (value_bytes > kMaxSessionFileChunkBytes) {
      return corrupt(absl::StrCat(ChunkName(id), " claims ", value_bytes,
                                  " bytes, over the limit"));
    }
    std::string value;
    if (!src.Read(value_bytes, &value)) return truncated(ChunkName(id));
    KVD_ASSIGN_OR_RETURN(DecodedChunk chunk, DecodeChunk(value, at));
    const v1::ChunkHeader& h = chunk.header;
    const bool residual = id.layer != kTokenLayer;
    if (h.layer() != id.layer || h.chunk_index() != id.index ||
        (residual &&
         (h.dtype() != m.dtype() || h.row_bytes() != m.row_bytes() ||
          std::find(m.layers().begin(), m.layers().end(), id.layer) ==
              m.layers().end()))) {
      return corrupt(
          absl::StrCat(ChunkName(id), " does not fit the update's manifest"));
    }
    update.put.emplace_back(id, std::move(value));
  }
  uint64_t count = 0;
  if (!read_int(&count)) return truncated("the trailer");
  const uint32_t expected = src.crc();
  uint32_t crc = 0;
  if (!read_int(&crc)) return truncated("the trailer");
  if (count != records) {
    return corrupt(absl::StrCat("the trailer counts ", count, " records, ",
                                records, " came"));
  }
  if (crc != expected) return corrupt("the stream's CRC32C does not match");
  if (!src.AtEnd()) return corrupt("bytes follow the trailer");
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
