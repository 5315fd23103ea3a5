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
#pragma once

#ifndef TINYGPT_THREADS
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
#endif  // TINYGPT_THREADS
