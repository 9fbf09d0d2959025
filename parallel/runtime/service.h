// A service on rank 0: one thread, with a communicator of its own, that answers small requests
// from every rank (SDPipe's group scheduler, the PS+SSP baseline's parameter server; anything
// central and light that the ranks ask while they train).
//
//   rank r != 0                        rank 0
//   ServiceClient --(comm: MPI/local)--> ServiceHost thread -> ServiceHandler::on_request
//                 <--------------------  ServiceHost::reply  (from the handler, now or later)
//   rank 0's own worker: ServiceClient --(in memory)--> the same thread
//
// A message is a byte string (a serialized protobuf message, at most kMaxBytes) and an optional
// f32 payload (a CPU tensor: weights, for the parameter server). On the wire: a fixed header of
// kHeaderBytes (the byte count, the payload's element count, the bytes), then the payload as a
// message of its own. Requests from one rank reach the handler in the order they were sent; so do
// replies to one rank.
//
// The thread polls the posted receives (Request::test) and the in-memory queue, calls
// ServiceHandler::on_tick after each round and sleeps at most kPoll while nothing happens (woken
// early by rank 0's own requests). An exception in the thread stops it; rank 0's client rethrows
// it (naming the service) at its next receive, and the other ranks' receives time out naming the
// service, so a dead or stuck service ends every rank within the communicator's timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/tensor.h"
#include "parallel/comm/communicator.h"

namespace strata::parallel {

struct ServiceMessage {
  std::string bytes;
  Tensor payload;  // undefined: none; else a contiguous f32 CPU tensor
};

class ServiceHost;

class ServiceHandler {
 public:
  virtual ~ServiceHandler() = default;
  // A request from `rank` at `now` (seconds on the host's clock). Runs on the service thread.
  virtual void on_request(ServiceHost& host, int rank, ServiceMessage request, double now) = 0;
  // After every round of requests, and at least every kPoll.
  virtual void on_tick(ServiceHost& host, double now) {}
};

class ServiceHost {
 public:
  static constexpr int kHeaderBytes = 512;
  static constexpr int kMaxBytes = kHeaderBytes - 12;
  static constexpr std::chrono::microseconds kPoll{200};

  // `comm`: rank 0's handle of the service's communicator (every rank holds one; the service
  // thread is its only user on rank 0). `name` is used in messages ("the SDPipe scheduler").
  ServiceHost(std::unique_ptr<Communicator> comm, std::string name);
  // Stops the thread (stop()) if it still runs.
  ~ServiceHost();
  ServiceHost(const ServiceHost&) = delete;
  ServiceHost& operator=(const ServiceHost&) = delete;

  void start(ServiceHandler* handler);
  // Sends the replies still queued, then ends the thread; rethrows its error, if any.
  void stop();
  const std::string& name() const { return name_; }
  int size() const { return comm_->size(); }
  double now() const;  // seconds since construction
  // For the handler (service thread): a reply to `rank`.
  void reply(int rank, ServiceMessage message);
  // A test hook: the thread stops answering (as if it hung) from now on.
  void freeze() { frozen_ = true; }

  // Rank 0's own client (its worker thread).
  void local_send(ServiceMessage message);
  ServiceMessage local_receive(const Tensor& payload, std::chrono::milliseconds timeout,
                               const std::string& what);

 private:
  void thread_main();
  void round(bool* progressed);

  std::unique_ptr<Communicator> comm_;
  std::string name_;
  ServiceHandler* handler_ = nullptr;
  std::chrono::steady_clock::time_point start_;
  std::vector<Tensor> headers_;                   // per rank: the posted header receive's buffer
  std::vector<std::unique_ptr<Request>> posted_;  // per rank (null for rank 0)
  std::vector<std::pair<std::unique_ptr<Request>, Tensor>> sending_;  // replies in flight
  bool frozen_ = false;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<ServiceMessage> local_requests_, local_replies_;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

class ServiceClient {
 public:
  // Rank 0: `host` (`comm` null); other ranks: `comm`, their handle of the service's
  // communicator. Every receive waits at most `timeout`.
  ServiceClient(Communicator* comm, ServiceHost* host, std::string name,
                std::chrono::milliseconds timeout);
  void send(const ServiceMessage& message);
  // The next reply; its payload (if any) goes into `payload` (same element count, contiguous
  // f32). Throws CommTimeout naming the service and `what` after the communicator's timeout.
  ServiceMessage receive(const Tensor& payload, const std::string& what);
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  Communicator* comm_;
  ServiceHost* host_;
  std::string name_;
  std::chrono::milliseconds timeout_;
  std::vector<std::pair<std::unique_ptr<Request>, Tensor>> sending_;
};

// The wire format (for tests): a header tensor for `message`, and its parsed form.
Tensor encode_service_header(const ServiceMessage& message, const std::string& service);
ServiceMessage decode_service_header(const Tensor& header, int64_t* payload_numel);

}  // namespace strata::parallel
