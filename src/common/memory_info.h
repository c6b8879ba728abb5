// What the machine offers in memory.
#pragma once

namespace distca {

// Physical RAM of this machine in bytes; 0 when the system cannot tell.
double PhysicalMemoryBytes();

}  // namespace distca
