// A fixed pool of worker threads for data-parallel loops: parallel_for(n, fn) cuts [0, n) into
// a few contiguous chunks per thread, which the threads take in turn until none is left, so a
// thread that is slowed down (another process on its core) takes fewer instead of holding up
// the rest. The calling thread takes chunks too instead of waiting in join(): on a two-core
// machine a caller that only waits leaves half the machine idle (the study queue's threads
// gotcha). Neither where the chunks are cut nor which thread runs one changes a result: every
// loop the trainer hands the pool computes each of its outputs within one chunk, the same way.
//
// Under Emscripten the worker threads are Web Workers sharing the module's memory; the build
// pre-spawns them (-sPTHREAD_POOL_SIZE) because a worker cannot start a new one synchronously.
// The freestanding build with workers (TINYGPT_WORKERS: zig's clang, no libc, no threads library)
// has its Web Workers started by its JavaScript (freestanding_loader.mjs), and they wait with the
// WebAssembly atomics themselves.
#pragma once

#if defined(TINYGPT_WORKERS)
// Each worker instance calls tg_worker_join() once, which numbers it from 1, then
// tg_worker_serve(id), which never returns. One set of workers per module: the pool is the
// module's state, and a Pool object only sets how many of the joined workers take part.
namespace workers {

// A training step is dozens of short loops back to back: a worker that went to sleep after each
// would pay an Atomics.wait round trip every time, so it spins a little first.
constexpr int SPINS = 1 << 18;
constexpr int CHUNKS = 8;  // per thread

inline int joined = 0;  // workers that have called tg_worker_join
inline unsigned generation = 0;  // one more for each job handed out
inline int active = 0;           // workers 1 .. active take part in this job
inline int next = 0, pending = 0, sleepers = 0, chunks = 0, n = 0;
inline const void* job = nullptr;
inline void (*call)(const void* job, int begin, int end) = nullptr;

template <class T>
T load(const T& x) {
  return __atomic_load_n(&x, __ATOMIC_SEQ_CST);
}

inline void run_chunks() {
  for (int c; (c = __atomic_fetch_add(&next, 1, __ATOMIC_SEQ_CST)) < chunks;) {
    int begin = static_cast<int>(static_cast<long long>(n) * c / chunks);
    int end = static_cast<int>(static_cast<long long>(n) * (c + 1) / chunks);
    call(job, begin, end);
  }
}

}  // namespace workers

extern "C" {
int tg_worker_join() { return __atomic_fetch_add(&workers::joined, 1, __ATOMIC_SEQ_CST) + 1; }

void tg_worker_serve(int id) {
  using namespace workers;
  for (unsigned seen = load(generation);;) {
    unsigned now = load(generation);
    for (int spin = 0; now == seen && spin < SPINS; ++spin) now = load(generation);
    while (now == seen) {  // a sleeper is counted before it waits, so the caller knows to wake it
      __atomic_fetch_add(&sleepers, 1, __ATOMIC_SEQ_CST);
      __builtin_wasm_memory_atomic_wait32(reinterpret_cast<int*>(&generation), static_cast<int>(seen), -1);
      __atomic_fetch_sub(&sleepers, 1, __ATOMIC_SEQ_CST);
      now = load(generation);
    }
    seen = now;
    if (id > load(active)) continue;
    run_chunks();
    __atomic_fetch_sub(&pending, 1, __ATOMIC_SEQ_CST);
  }
}
}

class Pool {
 public:
  // as many threads as asked for, if enough workers have joined
  explicit Pool(int threads) {
    int have = 1 + workers::load(workers::joined);
    threads_ = threads < 1 ? 1 : threads > have ? have : threads;
  }

  int threads() const { return threads_; }

  template <class Fn>
  void parallel_for(int n, const Fn& fn) {
    using namespace workers;
    if (threads_ == 1 || n < 2) {
      fn(0, n);
      return;
    }
    job = &fn;
    call = [](const void* f, int begin, int end) { (*static_cast<const Fn*>(f))(begin, end); };
    workers::n = n;
    chunks = n < CHUNKS * threads_ ? n : CHUNKS * threads_;
    __atomic_store_n(&next, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&active, threads_ - 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&pending, threads_ - 1, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&generation, 1, __ATOMIC_SEQ_CST);
    if (load(sleepers) > 0) __builtin_wasm_memory_atomic_notify(reinterpret_cast<int*>(&generation), ~0u);
    run_chunks();
    while (load(pending) != 0) {
    }
  }

 private:
  int threads_;
};
#elif !defined(TINYGPT_THREADS)
// A build without threads runs every loop on the caller, and needs none of the C++ thread
// library (the freestanding Memory64 build has none).
class Pool {
 public:
  explicit Pool(int) {}
  int threads() const { return 1; }
  template <class Fn>
  void parallel_for(int n, const Fn& fn) {
    fn(0, n);
  }
};
#else
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

class Pool {
 public:
  explicit Pool(int threads) : threads_(threads < 1 ? 1 : threads) {
    for (int id = 1; id < threads_; ++id) workers_.emplace_back([this] { serve(); });
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      generation_.fetch_add(1);
    }
    wake_.notify_all();
    for (auto& w : workers_) w.join();
  }

  int threads() const { return threads_; }

  // fn(begin, end) for chunks of [0, n); returns when every chunk is done.
  void parallel_for(int n, const std::function<void(int, int)>& fn) {
    if (threads_ == 1 || n < 2) {
      fn(0, n);
      return;
    }
    job_ = &fn;
    n_ = n;
    chunks_ = n < CHUNKS * threads_ ? n : CHUNKS * threads_;
    next_.store(0, std::memory_order_relaxed);
    pending_.store(threads_ - 1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      generation_.fetch_add(1, std::memory_order_release);
    }
    if (sleepers_.load() > 0) wake_.notify_all();
    run_chunks();
    while (pending_.load(std::memory_order_acquire) != 0) {
    }
  }

 private:
  // A training step is dozens of short loops back to back: a worker that went to sleep after
  // each would pay a wake-up (an Atomics.wait round trip in the browser) every time, so it
  // spins a little first and sleeps only when no work comes.
  static constexpr int SPINS = 1 << 18;
  static constexpr int CHUNKS = 8;  // per thread

  void run_chunks() {
    for (int c; (c = next_.fetch_add(1, std::memory_order_relaxed)) < chunks_;) {
      int begin = static_cast<int>(static_cast<long long>(n_) * c / chunks_);
      int end = static_cast<int>(static_cast<long long>(n_) * (c + 1) / chunks_);
      (*job_)(begin, end);
    }
  }

  void serve() {
    unsigned seen = 0;
    for (;;) {
      unsigned now = generation_.load(std::memory_order_acquire);
      for (int spin = 0; now == seen && spin < SPINS; ++spin) now = generation_.load(std::memory_order_acquire);
      if (now == seen) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleepers_.fetch_add(1);
        wake_.wait(lock, [&] { return generation_.load() != seen; });
        sleepers_.fetch_sub(1);
        now = generation_.load();
      }
      seen = now;
      if (stopping_) return;
      run_chunks();
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  const std::function<void(int, int)>* job_ = nullptr;
  int n_ = 0, chunks_ = 0;
  std::atomic<int> next_{0}, pending_{0}, sleepers_{0};
  std::atomic<unsigned> generation_{0};
  std::atomic<bool> stopping_{false};
};
#endif  // TINYGPT_WORKERS, TINYGPT_THREADS
