// The helpers the stand-in ruby_helpers.h and time_helpers.h declare: our own implementations,
// for the smoke driver only (inside Datadog's extension its own ones are used).
#include <errno.h>
#include <time.h>
#include <ruby.h>
#include "ruby_helpers.h"
#include "time_helpers.h"

// Exported by libruby (ObjectSpace.memsize_of calls it), declared by no public header.
size_t rb_obj_memsize_of(VALUE obj);

static VALUE object_space = Qnil;
static ID id2ref_id;

void ruby_helpers_init(void) {
  rb_global_variable(&object_space);
  object_space = rb_const_get(rb_cObject, rb_intern("ObjectSpace"));
  id2ref_id = rb_intern("_id2ref");
}

static VALUE call_id2ref(VALUE obj_id) { return rb_funcall(object_space, id2ref_id, 1, obj_id); }
static VALUE not_found(DDTRACE_UNUSED VALUE _arg, DDTRACE_UNUSED VALUE _exception) { return Qundef; }

bool ruby_ref_from_id(VALUE obj_id, VALUE *value) {
  VALUE found = rb_rescue2(call_id2ref, obj_id, not_found, Qnil, rb_eRangeError, (VALUE) 0);
  if (found == Qundef) return false;
  *value = found;
  return true;
}

size_t ruby_obj_memsize_of(VALUE obj) { return rb_obj_memsize_of(obj); }

int64_t monotonic_wall_time_now_ns(bool raise_on_failure) {
  struct timespec now;
  if (clock_gettime(CLOCK_MONOTONIC, &now) != 0) {
    if (raise_on_failure) rb_sys_fail("clock_gettime(CLOCK_MONOTONIC)");
    return 0;
  }
  return (int64_t) now.tv_sec * 1000000000 + now.tv_nsec;
}
