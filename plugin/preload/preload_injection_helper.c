/* A traced C program for preload_integration_test that initialises "CUDA":
 * it calls the tracer's InitializeInjection as the CUDA driver does inside
 * cuInit when CUDA_INJECTION64_PATH names the tracer, then exits normally.
 */
#include <dlfcn.h>
#include <stddef.h>

int main(void) {
  typedef int (*InitializeInjectionFn)(void);
  InitializeInjectionFn init = (InitializeInjectionFn)dlsym(RTLD_DEFAULT, "InitializeInjection");
  if (init == NULL) return 1;
  return init() == 1 ? 0 : 2;
}
