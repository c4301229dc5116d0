// Stand-in for the few helpers of Datadog's ruby_helpers.h that the shim and the smoke driver use
// (implemented in helpers.c beside this file), so that the driver builds from this repository alone.
#ifndef DDHEAP_STANDIN_RUBY_HELPERS_H
#define DDHEAP_STANDIN_RUBY_HELPERS_H

#include <ruby.h>
#include <stdbool.h>

#define DDTRACE_UNUSED __attribute__((unused))
#define VALUE_COUNT(array) (sizeof(array) / sizeof(VALUE))
#define raise_error(exception_class, ...) rb_raise(exception_class, __VA_ARGS__)

void ruby_helpers_init(void);
// The object `obj_id` (an object id) names, when it is alive: true and *value set; false when it
// is not (ObjectSpace._id2ref raised RangeError). Other exceptions propagate.
bool ruby_ref_from_id(VALUE obj_id, VALUE *value);
// rb_obj_memsize_of, as ObjectSpace.memsize_of measures.
size_t ruby_obj_memsize_of(VALUE obj);

#endif
