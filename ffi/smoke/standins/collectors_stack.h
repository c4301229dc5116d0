// Stand-in for the constant of Datadog's collectors_stack.h the shim uses (its value there).
#ifndef DDHEAP_STANDIN_COLLECTORS_STACK_H
#define DDHEAP_STANDIN_COLLECTORS_STACK_H

#define MAX_FRAMES_LIMIT 3000

#endif
