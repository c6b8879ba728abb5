// What both backends do with a rank's function: run it, a thrown exception
// becoming the rank's failure.
#pragma once

#include <fmt/format.h>

#include <exception>
#include <functional>
#include <new>

#include "distca/comm.h"

namespace distca::comm {

// fn(comm), or the Status of what it threw: "out of memory" (Unavailable)
// for an allocation too large for this machine, which is not a bug, else
// Internal.
inline Status RunRank(const std::function<Status(Comm&)>& fn, Comm& comm) {
  try {
    return fn(comm);
  } catch (const std::bad_alloc&) {
    return Status::Unavailable("out of memory");
  } catch (const std::exception& e) {
    return Status::Internal(fmt::format("exception: {}", e.what()));
  } catch (...) {
    return Status::Internal("unknown exception");
  }
}

}  // namespace distca::comm
