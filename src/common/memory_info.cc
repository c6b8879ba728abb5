#include "common/memory_info.h"

#include <unistd.h>

namespace distca {

double PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
}

}  // namespace distca
