// A fixed pool of worker threads for data-parallel loops: parallel_for(n, fn) splits [0, n) into
// one contiguous chunk per thread and runs them at once. The calling thread takes the first
// chunk itself instead of waiting in join(): on a two-core machine a caller that only waits
// leaves half the machine idle (the study queue's threads gotcha).
//
// Under Emscripten the worker threads are Web Workers sharing the module's memory; the build
// pre-spawns them (-sPTHREAD_POOL_SIZE) because a worker cannot start a new one synchronously.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

class Pool {
 public:
  explicit Pool(int threads) : threads_(threads < 1 ? 1 : threads) {
#ifdef TINYGPT_THREADS
    for (int id = 1; id < threads_; ++id) workers_.emplace_back([this, id] { serve(id); });
#else
    threads_ = 1;  // a build without threads runs every chunk on the caller
#endif
  }

  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      ++generation_;
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
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &fn;
      n_ = n;
      pending_ = threads_ - 1;
      ++generation_;
    }
    wake_.notify_all();
    run_chunk(0);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void run_chunk(int id) {
    int begin = static_cast<int>(static_cast<long long>(n_) * id / threads_);
    int end = static_cast<int>(static_cast<long long>(n_) * (id + 1) / threads_);
    if (begin < end) (*job_)(begin, end);
  }

  void serve(int id) {
    unsigned seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (stopping_) return;
      }
      run_chunk(id);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  int threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int, int)>* job_ = nullptr;
  int n_ = 0;
  int pending_ = 0;
  unsigned generation_ = 0;
  bool stopping_ = false;
};
