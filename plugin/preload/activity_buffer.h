// A CUPTI activity buffer on its way from CUPTI to the writer thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace dynaflow {

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};

// Memory from std::aligned_alloc/malloc, freed with std::free.
using BufferMemory = std::unique_ptr<uint8_t, FreeDeleter>;

// A completed buffer: CUPTI filled the first `valid_size` of `size` bytes
// with activity records and handed the memory back to us.
struct ActivityBuffer {
  BufferMemory data;
  size_t size = 0;
  size_t valid_size = 0;
};

}  // namespace dynaflow
