// Stand-in for the one function of Datadog's time_helpers.h the shim uses.
#ifndef DDHEAP_STANDIN_TIME_HELPERS_H
#define DDHEAP_STANDIN_TIME_HELPERS_H

#include <stdbool.h>
#include <stdint.h>

#define RAISE_ON_FAILURE true
#define DO_NOT_RAISE_ON_FAILURE false

// CLOCK_MONOTONIC in ns; 0 on failure, or a SystemCallError when `raise_on_failure`.
int64_t monotonic_wall_time_now_ns(bool raise_on_failure);

#endif
