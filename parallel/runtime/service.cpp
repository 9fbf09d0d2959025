// ServiceHost / ServiceClient: see service.h. Tags on the service's own communicator:
// request header 1, request payload 2, reply header 3, reply payload 4.
#include "parallel/runtime/service.h"

#include <cstring>

#include "engine/check.h"

namespace strata::parallel {
namespace {

constexpr int kRequestTag = 1, kRequestPayloadTag = 2, kReplyTag = 3, kReplyPayloadTag = 4;

void check_payload(const Tensor& t, const std::string& where) {
  STRATA_CHECK(!t.defined() ||
               (t.dtype() == DType::kF32 && t.device().is_cpu() && t.is_contiguous()))
      << where << ": a payload must be a contiguous f32 CPU tensor, got " << t.str();
}

// Keeps only the sends still in flight.
void drop_completed(std::vector<std::pair<std::unique_ptr<Request>, Tensor>>* sending) {
  for (auto it = sending->begin(); it != sending->end();) {
    it = it->first->test() ? sending->erase(it) : std::next(it);
  }
}

}  // namespace

Tensor encode_service_header(const ServiceMessage& message, const std::string& service) {
  STRATA_CHECK(message.bytes.size() <= static_cast<size_t>(ServiceHost::kMaxBytes))
      << service << ": a message of " << message.bytes.size() << " bytes is longer than "
      << ServiceHost::kMaxBytes;
  check_payload(message.payload, service);
  Tensor header = Tensor::zeros({ServiceHost::kHeaderBytes}, DType::kU8);
  uint8_t* p = header.data<uint8_t>();
  const uint32_t n = static_cast<uint32_t>(message.bytes.size());
  const int64_t numel = message.payload.defined() ? message.payload.numel() : 0;
  std::memcpy(p, &n, 4);
  std::memcpy(p + 4, &numel, 8);
  std::memcpy(p + 12, message.bytes.data(), n);
  return header;
}

ServiceMessage decode_service_header(const Tensor& header, int64_t* payload_numel) {
  const uint8_t* p = header.data<uint8_t>();
  uint32_t n = 0;
  std::memcpy(&n, p, 4);
  std::memcpy(payload_numel, p + 4, 8);
  STRATA_CHECK(n <= static_cast<uint32_t>(ServiceHost::kMaxBytes) && *payload_numel >= 0)
      << "service message header is corrupt (" << n << " bytes, payload " << *payload_numel << ")";
  ServiceMessage m;
  m.bytes.assign(reinterpret_cast<const char*>(p + 12), n);
  return m;
}

ServiceHost::ServiceHost(std::unique_ptr<Communicator> comm, std::string name)
    : comm_(std::move(comm)), name_(std::move(name)), start_(std::chrono::steady_clock::now()) {
  STRATA_CHECK(comm_ != nullptr && comm_->rank() == 0)
      << name_ << ": the service runs on rank 0 of its communicator";
}

ServiceHost::~ServiceHost() {
  try {
    stop();
  } catch (const std::exception&) {
    // Already reported to rank 0's client; a destructor must not throw.
  }
}

double ServiceHost::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ServiceHost::start(ServiceHandler* handler) {
  STRATA_CHECK(handler != nullptr && !thread_.joinable()) << name_ << ": started twice";
  handler_ = handler;
  const int n = comm_->size();
  headers_.resize(static_cast<size_t>(n));
  posted_.resize(static_cast<size_t>(n));
  for (int r = 1; r < n; ++r) {
    headers_[r] = Tensor::zeros({kHeaderBytes}, DType::kU8);
    posted_[r] = comm_->irecv(headers_[r], r, kRequestTag);
  }
  thread_ = std::thread([this] { thread_main(); });
}

void ServiceHost::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  posted_.clear();  // cancels the receives still posted
  std::lock_guard<std::mutex> lock(mutex_);
  if (error_) std::rethrow_exception(error_);
}

void ServiceHost::thread_main() {
  try {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stop_) break;
      }
      bool progressed = false;
      if (!frozen_) round(&progressed);
      if (!progressed) {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait_for(lock, kPoll, [&] { return stop_ || !local_requests_.empty(); });
      }
    }
    // The replies still in flight go out before the thread ends.
    for (auto& [r, t] : sending_) r->wait(comm_->timeout(), name_ + ": a reply at shutdown");
    sending_.clear();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = std::make_exception_ptr(Error(name_ + " on rank 0 failed: " + error_message(e)));
    changed_.notify_all();
  }
}

void ServiceHost::round(bool* progressed) {
  for (int r = 1; r < comm_->size(); ++r) {
    if (!posted_[r]->test()) continue;
    int64_t numel = 0;
    ServiceMessage m = decode_service_header(headers_[r], &numel);
    if (numel > 0) {
      m.payload = Tensor::empty({numel}, DType::kF32);
      comm_->irecv(m.payload, r, kRequestPayloadTag)
          ->wait(comm_->timeout(),
                 name_ + ": the payload of a request from rank " + std::to_string(r));
    }
    posted_[r] = comm_->irecv(headers_[r], r, kRequestTag);
    handler_->on_request(*this, r, std::move(m), now());
    *progressed = true;
  }
  for (;;) {
    ServiceMessage m;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (local_requests_.empty()) break;
      m = std::move(local_requests_.front());
      local_requests_.pop_front();
    }
    handler_->on_request(*this, 0, std::move(m), now());
    *progressed = true;
  }
  handler_->on_tick(*this, now());
  drop_completed(&sending_);
}

void ServiceHost::reply(int rank, ServiceMessage message) {
  STRATA_CHECK(rank >= 0 && rank < comm_->size()) << name_ << ": a reply to rank " << rank;
  if (rank == 0) {
    check_payload(message.payload, name_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      local_replies_.push_back(std::move(message));
    }
    changed_.notify_all();
    return;
  }
  Tensor header = encode_service_header(message, name_);
  sending_.emplace_back(comm_->isend(header, rank, kReplyTag), header);
  if (message.payload.defined() && message.payload.numel() > 0) {
    sending_.emplace_back(comm_->isend(message.payload, rank, kReplyPayloadTag), message.payload);
  }
}

void ServiceHost::local_send(ServiceMessage message) {
  check_payload(message.payload, name_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(error_);
    // A payload is copied: the sender may change its tensor right away, as over a communicator.
    if (message.payload.defined()) message.payload = message.payload.clone();
    local_requests_.push_back(std::move(message));
  }
  changed_.notify_all();
}

ServiceMessage ServiceHost::local_receive(const Tensor& payload, std::chrono::milliseconds timeout,
                                          const std::string& what) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (local_replies_.empty()) {
    if (error_) std::rethrow_exception(error_);
    if (timeout.count() <= 0) {
      changed_.wait(lock);
    } else if (changed_.wait_until(lock, deadline) == std::cv_status::timeout &&
               local_replies_.empty()) {
      if (error_) std::rethrow_exception(error_);
      throw CommTimeout("rank 0 timed out after " + std::to_string(timeout.count()) +
                        " ms waiting for " + what + " from " + name_ + " on rank 0");
    }
  }
  ServiceMessage m = std::move(local_replies_.front());
  local_replies_.pop_front();
  if (m.payload.defined() && m.payload.numel() > 0) {
    STRATA_CHECK(payload.defined() && payload.numel() == m.payload.numel())
        << name_ << ": a reply of " << m.payload.numel() << " values for a buffer of "
        << (payload.defined() ? payload.numel() : 0);
    payload.copy_from(m.payload);
  }
  return m;
}

ServiceClient::ServiceClient(Communicator* comm, ServiceHost* host, std::string name,
                             std::chrono::milliseconds timeout)
    : comm_(comm), host_(host), name_(std::move(name)), timeout_(timeout) {
  STRATA_CHECK((comm_ == nullptr) != (host_ == nullptr))
      << name_ << ": a client talks to the host in memory (rank 0) or over a communicator";
  STRATA_CHECK(comm_ == nullptr || comm_->rank() != 0)
      << name_ << ": rank 0's client talks to the host in memory";
}

void ServiceClient::send(const ServiceMessage& message) {
  if (host_ != nullptr) {
    host_->local_send(message);
    return;
  }
  drop_completed(&sending_);
  Tensor header = encode_service_header(message, name_);
  sending_.emplace_back(comm_->isend(header, 0, kRequestTag), header);
  if (message.payload.defined() && message.payload.numel() > 0) {
    sending_.emplace_back(comm_->isend(message.payload, 0, kRequestPayloadTag), message.payload);
  }
}

ServiceMessage ServiceClient::receive(const Tensor& payload, const std::string& what) {
  check_payload(payload, name_);
  if (host_ != nullptr) return host_->local_receive(payload, timeout_, what);
  Tensor header = Tensor::zeros({ServiceHost::kHeaderBytes}, DType::kU8);
  comm_->irecv(header, 0, kReplyTag)->wait(timeout_, what + " from " + name_ + " on rank 0");
  int64_t numel = 0;
  ServiceMessage m = decode_service_header(header, &numel);
  if (numel > 0) {
    STRATA_CHECK(payload.defined() && payload.numel() == numel)
        << name_ << ": a reply of " << numel << " values for a buffer of "
        << (payload.defined() ? payload.numel() : 0);
    comm_->irecv(payload, 0, kReplyPayloadTag)
        ->wait(timeout_, "the payload of " + what + " from " + name_ + " on rank 0");
  }
  drop_completed(&sending_);
  return m;
}

}  // namespace strata::parallel
