#include "services/node/grpc_reflection_v1.h"

#include <memory>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "grpcpp/impl/server_initializer.h"

namespace kvd::node {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;
using grpc::reflection::v1::ServerReflectionRequest;
using grpc::reflection::v1::ServerReflectionResponse;

// Adds `file` and then every file it imports that `sent` does not hold yet,
// so a client can build the whole descriptor set from one stream.
void AddFile(const FileDescriptor* file, std::set<std::string>& sent,
             ServerReflectionResponse& response) {
  if (!sent.insert(file->name()).second) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  response.mutable_file_descriptor_response()->add_file_descriptor_proto(
      proto.SerializeAsString());
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFile(file->dependency(i), sent, response);
  }
}

void SetError(grpc::StatusCode code, std::string message,
              ServerReflectionResponse& response) {
  response.mutable_error_response()->set_error_code(static_cast<int>(code));
  response.mutable_error_response()->set_error_message(std::move(message));
}

// Registers the service when the server is built and hands it the names of
// every service the server ended up with.
class ReflectionV1Plugin final : public grpc::ServerBuilderPlugin {
 public:
  std::string name() override { return "kvd_reflection_v1"; }
  void InitServer(grpc::ServerInitializer* si) override {
    si->RegisterService(service_);
  }
  void Finish(grpc::ServerInitializer* si) override {
    service_->SetServices(*si->GetServiceList());
  }
  void ChangeArguments(const std::string&, void*) override {}
  bool has_sync_methods() const override { return true; }

 private:
  std::shared_ptr<GrpcReflectionV1> service_ =
      std::make_shared<GrpcReflectionV1>();
};

class ReflectionV1Option final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*
                         plugins) override {
    plugins->push_back(std::make_unique<ReflectionV1Plugin>());
  }
};

}  // namespace

void GrpcReflectionV1::SetServices(std::vector<std::string> services) {
  absl::MutexLock lock(&mu_);
  services_ = std::move(services);
}

grpc::Status GrpcReflectionV1::ServerReflectionInfo(
    grpc::ServerContext*,
    grpc::ServerReaderWriter<ServerReflectionResponse, ServerReflectionRequest>*
        stream) {
  const DescriptorPool* pool = DescriptorPool::generated_pool();
  std::set<std::string> sent;  // files this stream has already carried
  ServerReflectionRequest request;
  while (stream->Read(&request)) {
    ServerReflectionResponse response;
    response.set_valid_host(request.host());
    *response.mutable_original_request() = request;
    switch (request.message_request_case()) {
      case ServerReflectionRequest::kListServices: {
        absl::MutexLock lock(&mu_);
        for (const std::string& s : services_) {
          response.mutable_list_services_response()->add_service()->set_name(s);
        }
        break;
      }
      case ServerReflectionRequest::kFileByFilename: {
        const FileDescriptor* f =
            pool->FindFileByName(request.file_by_filename());
        if (f == nullptr) {
          SetError(grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("no file '", request.file_by_filename(), "'"),
                   response);
        } else {
          AddFile(f, sent, response);
        }
        break;
      }
      case ServerReflectionRequest::kFileContainingSymbol: {
        const FileDescriptor* f =
            pool->FindFileContainingSymbol(request.file_containing_symbol());
        if (f == nullptr) {
          SetError(grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("no symbol '", request.file_containing_symbol(),
                                "'"),
                   response);
        } else {
          AddFile(f, sent, response);
        }
        break;
      }
      case ServerReflectionRequest::kFileContainingExtension: {
        const auto& ext = request.file_containing_extension();
        const google::protobuf::Descriptor* type =
            pool->FindMessageTypeByName(ext.containing_type());
        const google::protobuf::FieldDescriptor* field =
            type == nullptr
                ? nullptr
                : pool->FindExtensionByNumber(type, ext.extension_number());
        if (field == nullptr) {
          SetError(grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("no extension ", ext.extension_number(),
                                " of '", ext.containing_type(), "'"),
                   response);
        } else {
          AddFile(field->file(), sent, response);
        }
        break;
      }
      case ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const std::string& name = request.all_extension_numbers_of_type();
        const google::protobuf::Descriptor* type =
            pool->FindMessageTypeByName(name);
        if (type == nullptr) {
          SetError(grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("no message type '", name, "'"), response);
          break;
        }
        std::vector<const google::protobuf::FieldDescriptor*> extensions;
        pool->FindAllExtensions(type, &extensions);
        auto* numbers = response.mutable_all_extension_numbers_response();
        numbers->set_base_type_name(name);
        for (const auto* e : extensions)
          numbers->add_extension_number(e->number());
        break;
      }
      case ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        SetError(grpc::StatusCode::INVALID_ARGUMENT,
                 "the request names nothing to look up", response);
        break;
    }
    if (!stream->Write(response)) break;
  }
  return grpc::Status::OK;
}

void AddReflectionV1(grpc::ServerBuilder& builder) {
  builder.SetOption(std::make_unique<ReflectionV1Option>());
}

}  // namespace kvd::node
