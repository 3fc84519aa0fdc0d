/* The pod sandbox's process: holds the pod's namespaces open and does nothing else.
 *
 * The CRI runtime starts one per pod before the pod's containers. Nothing can be pulled on the
 * test machines, so the harness compiles this (statically) and imports it as the sandbox image
 * containerd's config names. It behaves like Kubernetes' own pause: exits on SIGINT/SIGTERM and
 * reaps zombies, which it may inherit as PID 1 of a pod that shares its process namespace. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig) { _exit(128 + sig); }

static void on_child(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction stop = {.sa_handler = on_stop};
  struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0)
    return 1;
  for (;;) pause();
}
