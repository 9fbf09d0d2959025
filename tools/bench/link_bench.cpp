// Flow control on the emulated link at the message level (DynPipe §5 item 17,
// ../shared/papers/dynpipe.md; the link: parallel/comm/shaped_comm.h, a cost model, not a measured
// network): the latency of training messages (activations, one every --period-ms) while a
// migration's state (--bulk-mb) crosses the same link, chunked (--chunk-mb, at most --window-mb
// in flight with flow control, every chunk posted at once without) or as one whole message, with
// flow control (training first) or FIFO, beside the latency without bulk traffic. Two local ranks;
// rank 0 sends, rank 1 receives; a latency is from the isend to the completed receive (one
// process, one clock). Prints per configuration the median and worst latency and how long the
// bulk state took.
//
//   link_bench [--mbps 16] [--bulk-mb 4] [--chunk-mb 0.0625] [--window-mb 0.125] [--act-kb 16]
//              [--period-ms 20] [--acts 100] [--repeats 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "engine/check.h"
#include "engine/tensor.h"
#include "parallel/comm/local_comm.h"
#include "parallel/comm/shaped_comm.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
using parallel::Communicator;
using parallel::Request;

struct Options {
  double mbps = 16, bulk_mb = 4, chunk_mb = 0.0625, window_mb = 0.125, act_kb = 16;
  double period_ms = 20;
  int acts = 100, repeats = 3;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    STRATA_CHECK(i + 1 < argc) << "link_bench: " << flag << " needs a value";
    const double v = std::atof(argv[++i]);
    if (flag == "--mbps") {
      o.mbps = v;
    } else if (flag == "--bulk-mb") {
      o.bulk_mb = v;
    } else if (flag == "--chunk-mb") {
      o.chunk_mb = v;
    } else if (flag == "--window-mb") {
      o.window_mb = v;
    } else if (flag == "--act-kb") {
      o.act_kb = v;
    } else if (flag == "--period-ms") {
      o.period_ms = v;
    } else if (flag == "--acts") {
      o.acts = static_cast<int>(v);
    } else if (flag == "--repeats") {
      o.repeats = static_cast<int>(v);
    } else {
      STRATA_THROW() << "link_bench: unknown flag " << flag;
    }
  }
  return o;
}

struct Config {
  const char* name;
  bool bulk, chunked, flow;
};

struct Result {
  double median_ms = 0, max_ms = 0, bulk_s = 0;
};

// The bulk state in chunks of `chunk` elements (all of it at once: chunk = numel), at most
// `window` elements posted and not completed (0: no cap).
void move_bulk(Communicator& comm, const Tensor& flat, bool send, int64_t chunk, int64_t window) {
  std::deque<std::pair<std::unique_ptr<Request>, int64_t>> in_flight;
  int64_t posted = 0;
  int tag = 0;
  for (int64_t start = 0; start < flat.numel(); start += chunk) {
    const int64_t n = std::min(chunk, flat.numel() - start);
    while (window > 0 && !in_flight.empty() && posted + n > window) {
      in_flight.front().first->wait(comm.timeout(), "a bulk chunk");
      posted -= in_flight.front().second;
      in_flight.pop_front();
    }
    const Tensor part = flat.narrow(0, start, n);
    in_flight.emplace_back(send ? comm.isend(part, 1, tag) : comm.irecv(part, 0, tag), n);
    ++tag;
    posted += n;
  }
  for (auto& [r, n] : in_flight) r->wait(comm.timeout(), "a bulk chunk");
}

Result run(const Options& o, const Config& c) {
  const int64_t act = static_cast<int64_t>(o.act_kb * 1024 / 4);
  const int64_t bulk = static_cast<int64_t>(o.bulk_mb * (1 << 20) / 4);
  const int64_t chunk = c.chunked ? static_cast<int64_t>(o.chunk_mb * (1 << 20) / 4) : bulk;
  const int64_t window = c.flow ? static_cast<int64_t>(o.window_mb * (1 << 20) / 4) : 0;
  std::vector<Clock::time_point> sent(static_cast<size_t>(o.acts)), got(sent.size());
  Clock::time_point bulk_start, bulk_end;
  parallel::LocalWorld world(2);
  parallel::run_local_ranks(world, [&](parallel::LocalCommunicator& comm) {
    auto link = std::make_shared<parallel::ShapedLink>(comm.rank(), o.mbps * 1e6 / 8, c.flow);
    auto shaped = parallel::ShapedCommunicator::wrap_world(comm, link);
    std::unique_ptr<Communicator> train = shaped->split(0, comm.rank());
    std::unique_ptr<Communicator> moves = shaped->split(0, comm.rank());
    const bool sender = comm.rank() == 0;
    Tensor state = Tensor::full({bulk}, 1.0, DType::kF32);
    shaped->barrier("start");
    std::thread mover;
    if (c.bulk) {
      mover = std::thread([&] {
        const parallel::TrafficClassScope scope(parallel::TrafficClass::kBulk);
        if (sender) bulk_start = Clock::now();
        move_bulk(*moves, state, sender, chunk, window);
        if (!sender) bulk_end = Clock::now();
      });
    }
    std::vector<Tensor> acts;
    std::vector<std::unique_ptr<Request>> requests;
    for (int i = 0; i < o.acts; ++i) acts.push_back(Tensor::full({act}, 1.0, DType::kF32));
    if (sender) {
      const Clock::time_point t0 = Clock::now();
      for (int i = 0; i < o.acts; ++i) {
        std::this_thread::sleep_until(
            t0 + std::chrono::microseconds(static_cast<int64_t>(1e3 * o.period_ms * i)));
        sent[static_cast<size_t>(i)] = Clock::now();
        requests.push_back(train->isend(acts[static_cast<size_t>(i)], 1, i));
      }
      for (auto& r : requests) r->wait(train->timeout(), "an activation");
    } else {
      for (int i = 0; i < o.acts; ++i) {
        train->irecv(acts[static_cast<size_t>(i)], 0, i)->wait(train->timeout(), "an activation");
        got[static_cast<size_t>(i)] = Clock::now();
      }
    }
    if (mover.joinable()) mover.join();
    shaped->barrier("end");
  });
  std::vector<double> ms;
  for (size_t i = 0; i < sent.size(); ++i) {
    ms.push_back(std::chrono::duration<double, std::milli>(got[i] - sent[i]).count());
  }
  std::sort(ms.begin(), ms.end());
  Result r;
  r.median_ms = ms[ms.size() / 2];
  r.max_ms = ms.back();
  r.bulk_s = c.bulk ? std::chrono::duration<double>(bulk_end - bulk_start).count() : 0.0;
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) {
  using namespace strata;
  try {
    const Options o = parse(argc, argv);
    const std::vector<Config> configs = {{"no bulk traffic", false, false, true},
                                         {"chunked + flow control", true, true, true},
                                         {"chunked, FIFO", true, true, false},
                                         {"whole + flow control", true, false, true},
                                         {"whole, FIFO", true, false, false}};
    std::printf(
        "emulated link (a cost model, not a measured network): %g Mbit/s; activations of %g KiB "
        "every %g ms (%d); bulk %g MiB in chunks of %g MiB (window %g MiB with flow control, "
        "none with FIFO) or whole; medians of %d interleaved repeats\n\n",
        o.mbps, o.act_kb, o.period_ms, o.acts, o.bulk_mb, o.chunk_mb, o.window_mb, o.repeats);
    std::vector<std::vector<Result>> results(configs.size());
    for (int rep = 0; rep < o.repeats; ++rep) {
      for (size_t k = 0; k < configs.size(); ++k) results[k].push_back(run(o, configs[k]));
    }
    std::printf("| bulk | activation latency median ms | max ms | bulk s |\n|---|---|---|---|\n");
    for (size_t k = 0; k < configs.size(); ++k) {
      std::vector<double> med, mx, bs;
      for (const Result& r : results[k]) {
        med.push_back(r.median_ms);
        mx.push_back(r.max_ms);
        bs.push_back(r.bulk_s);
      }
      std::printf("| %s | %.1f | %.1f | %.2f |\n", configs[k].name, median(med), median(mx),
                  median(bs));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "link_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
