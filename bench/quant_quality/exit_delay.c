/* Preloaded into llama-perplexity by run.py (LD_PRELOAD): waits a moment when the process exits.
 * llama.cpp's logger prints from a worker thread that the process leaks on purpose (see the
 * comment at common_log_main in its common/log.cpp), so on a busy machine the last lines --
 * the closing statistics -- can be lost when main returns before the worker has printed them.
 * Waiting in a destructor leaves the worker time to drain its queue. */
#include <stdlib.h>
#include <unistd.h>

__attribute__((destructor)) static void delay_exit(void) {
  const char* ms = getenv("EXIT_DELAY_MS");
  usleep((useconds_t)(ms ? atoi(ms) : 1000) * 1000u);
}
