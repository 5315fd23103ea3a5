// The definitions behind this folder's headers, for zig's freestanding builds (Memory64, relaxed SIMD).
//
// Memory: a first-fit free list over blocks carved from the end of the heap, which grows with
// memory.grow when it runs out. In the build with workers (TINYGPT_WORKERS) a spin lock keeps
// the list whole when two workers allocate at once; growing is safe there too, because the
// workers touch memory only from WebAssembly, never through a JavaScript view of the old buffer
// (Emscripten's threaded build allocates all its memory up front for that reason).
//
// Math: exp, log, erf and cos in double precision by argument reduction and series, to about
// 1e-15 — accurate enough that the float results round as a libm's do, nearly always.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

extern unsigned char __heap_base;

namespace {

struct Block {
  size_t size;  // usable bytes after this header
  Block* next;  // the next free block, while this one is free
};
constexpr size_t ALIGN = 16, HEADER = (sizeof(Block) + ALIGN - 1) / ALIGN * ALIGN, PAGE = 65536;

Block* free_list = nullptr;
uintptr_t heap_end = 0;  // first byte not yet handed out

void* carve(size_t n) {
  if (!heap_end) heap_end = (reinterpret_cast<uintptr_t>(&__heap_base) + ALIGN - 1) / ALIGN * ALIGN;
  uintptr_t start = heap_end, end = start + HEADER + n;
  uintptr_t have = __builtin_wasm_memory_size(0) * PAGE;
  if (end > have && __builtin_wasm_memory_grow(0, (end - have + PAGE - 1) / PAGE) == static_cast<size_t>(-1))
    return nullptr;  // out of memory: callers see a null pointer, and tg_create says so
  heap_end = end;
  auto* b = reinterpret_cast<Block*>(start);
  b->size = n;
  return reinterpret_cast<unsigned char*>(b) + HEADER;
}

#ifdef TINYGPT_WORKERS
int lock_word = 0;
struct Locked {
  Locked() {
    while (__atomic_exchange_n(&lock_word, 1, __ATOMIC_ACQUIRE)) {
    }
  }
  ~Locked() { __atomic_store_n(&lock_word, 0, __ATOMIC_RELEASE); }
};
#else
struct Locked {};
#endif

}  // namespace

extern "C" {

void* malloc(size_t n) {
  Locked locked;
  n = (n + ALIGN - 1) / ALIGN * ALIGN;
  for (Block** link = &free_list; *link; link = &(*link)->next) {
    Block* b = *link;
    if (b->size >= n && b->size <= 2 * n + 1024) {  // first fit, without wasting a big block on a small ask
      *link = b->next;
      return reinterpret_cast<unsigned char*>(b) + HEADER;
    }
  }
  return carve(n);
}

void free(void* p) {
  if (!p) return;
  Locked locked;
  auto* b = reinterpret_cast<Block*>(static_cast<unsigned char*>(p) - HEADER);
  b->next = free_list;
  free_list = b;
}

void* calloc(size_t count, size_t size) {
  if (size && count > static_cast<size_t>(-1) / size) return nullptr;
  void* p = malloc(count * size);
  return p ? memset(p, 0, count * size) : nullptr;
}

// With bulk memory (-mbulk-memory) these compile to single memory.copy / memory.fill
// instructions, not to calls back into themselves.
void* memcpy(void* dst, const void* src, size_t n) { return __builtin_memcpy(dst, src, n); }
void* memmove(void* dst, const void* src, size_t n) { return __builtin_memmove(dst, src, n); }
void* memset(void* dst, int value, size_t n) { return __builtin_memset(dst, value, n); }

int memcmp(const void* a, const void* b, size_t n) {
  auto *x = static_cast<const unsigned char*>(a), *y = static_cast<const unsigned char*>(b);
  for (; n--; ++x, ++y)
    if (*x != *y) return *x < *y ? -1 : 1;
  return 0;
}

int snprintf(char* out, size_t size, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  size_t n = 0;
  auto put = [&](char c) {
    if (n + 1 < size) out[n] = c;
    ++n;
  };
  auto number = [&](long long v) {
    char digits[24];
    int k = 0;
    unsigned long long u = v < 0 ? 0ull - static_cast<unsigned long long>(v) : static_cast<unsigned long long>(v);
    do digits[k++] = static_cast<char>('0' + u % 10);
    while (u /= 10);
    if (v < 0) put('-');
    while (k) put(digits[--k]);
  };
  for (const char* f = fmt; *f; ++f) {
    if (*f != '%') {
      put(*f);
      continue;
    }
    ++f;
    if (*f == 'l') {
      ++f;
      number(va_arg(args, long));
    } else if (*f == 'd') {
      number(va_arg(args, int));
    } else if (*f == 's') {
      for (const char* s = va_arg(args, const char*); *s; ++s) put(*s);
    } else {
      put(*f);  // %% and anything unknown: the character itself
    }
  }
  if (size) out[n < size ? n : size - 1] = '\0';
  va_end(args);
  return static_cast<int>(n);
}

}  // extern "C"

void* operator new(size_t n) { return malloc(n); }
void operator delete(void* p) noexcept { free(p); }
void operator delete(void* p, size_t) noexcept { free(p); }

namespace {

constexpr double LN2_HI = 6.93147180369123816490e-01, LN2_LO = 1.90821492927058770002e-10;
constexpr double LN2 = 0.6931471805599453, PI = 3.141592653589793, TWO_PI_HI = 6.28318530717958623200,
                 TWO_PI_LO = 2.44929359829470635445e-16;

double bits_to_double(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof d);
  return d;
}

uint64_t double_to_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

double times_power_of_two(double x, int k) {  // x * 2^k in steps that stay normal
  while (k > 1000) x *= 0x1p1000, k -= 1000;
  while (k < -1000) x *= 0x1p-1000, k += 1000;
  return x * bits_to_double(static_cast<uint64_t>(k + 1023) << 52);
}

}  // namespace

namespace freestanding {

// 1 / n for the series below: multiplying is many times cheaper than dividing, and the
// activations' erf and exp are the trainer's hottest math
struct Reciprocals {
  double of[164];
  constexpr Reciprocals() : of() {
    for (int n = 1; n < 164; ++n) of[n] = 1.0 / n;
  }
};
constexpr Reciprocals inv;

// e^x = 2^k e^r, |r| <= ln2 / 2, e^r by its Taylor series to r^13 / 13!
double exp(double x) {
  if (x != x) return x;
  if (x > 709.8) return __builtin_inf();
  if (x < -745.2) return 0.0;
  double k = __builtin_round(x / LN2);
  double r = x - k * LN2_HI - k * LN2_LO, sum = 1.0;
  for (int n = 13; n >= 1; --n) sum = 1.0 + r * inv.of[n] * sum;  // Horner: 1 + r(1 + r/2(1 + r/3(...)))
  return times_power_of_two(sum, static_cast<int>(k));
}

// log x = e ln2 + 2 atanh(s), x = m 2^e with m in [sqrt(1/2), sqrt(2)), s = (m - 1) / (m + 1)
double log(double x) {
  if (x != x || x < 0) return __builtin_nan("");
  if (x == 0) return -__builtin_inf();
  if (x == __builtin_inf()) return x;
  int e = 0;
  if (x < 0x1p-1000) x *= 0x1p1000, e -= 1000;  // subnormals: make the exponent field honest
  uint64_t u = double_to_bits(x);
  e += static_cast<int>((u >> 52) & 0x7ff) - 1022;
  double m = bits_to_double((u & 0x000fffffffffffffull) | 0x3fe0000000000000ull);  // [0.5, 1)
  if (m < 0.70710678118654752) m *= 2, --e;
  double s = (m - 1) / (m + 1), s2 = s * s, power = s, sum = s;
  for (int n = 3; n <= 25; n += 2) sum += (power *= s2) * inv.of[n];
  return e * LN2 + 2 * sum;
}

// erf by its Taylor series near 0, and 1 - erfc(x) by erfc's continued fraction beyond 2.5
double erf(double x) {
  double a = __builtin_fabs(x);
  if (a < 2.5) {  // the terms shrink past 1e-17 of the sum within 60 for any |x| < 2.5
    double term = x, sum = x, x2 = x * x;
    for (int n = 1; n < 80; ++n) {
      double add = (term *= -x2 * inv.of[n]) * inv.of[2 * n + 1];
      sum += add;
      if (__builtin_fabs(add) <= 1e-17 * __builtin_fabs(sum)) break;
    }
    return 1.1283791670955126 * sum;  // 2 / sqrt(pi)
  }
  if (a > 6.0) return x > 0 ? 1.0 : -1.0;
  double f = a;
  for (int k = 60; k > 0; --k) f = a + (k / 2.0) / f;
  double erfc = exp(-a * a) / (1.7724538509055159 * f);  // sqrt(pi)
  return x > 0 ? 1.0 - erfc : erfc - 1.0;
}

// cos by its Taylor series after reducing x to [-pi, pi]
double cos(double x) {
  double k = __builtin_round(x / (2 * PI));
  x = (x - k * TWO_PI_HI) - k * TWO_PI_LO;
  double term = 1.0, sum = 1.0, x2 = x * x;
  for (int n = 2; n <= 40; n += 2) sum += (term *= -x2 * inv.of[n - 1] * inv.of[n]);
  return sum;
}

}  // namespace freestanding
