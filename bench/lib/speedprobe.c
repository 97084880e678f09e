/* A fixed piece of CPU work, timed: how fast the core it is pinned to runs right now.
 *
 * bench/run runs it on the proxy's core before every measurement (the proxy idle). On a shared virtual machine
 * the same work takes up to a third longer from one minute to the next (another tenant on the sibling hyperthread,
 * frequency), and every CPU-per-request figure moves with it; the report shows the spread so a reader can tell a
 * slow round from a slow proxy. Integer work and a walk over 4 MiB (so caches count, as they do for a proxy).
 * Prints the seconds taken. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(void) {
    enum { SIZE = 4 << 20 };
    volatile unsigned long sum = 0;
    unsigned char *memory = calloc(SIZE, 1);
    if (!memory) return 1;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (unsigned long i = 0; i < 100000000UL; i++) {
        sum += i * 7;
        memory[(i * 64) & (SIZE - 1)]++;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    printf("%.4f\n", (double)(end.tv_sec - start.tv_sec) + (end.tv_nsec - start.tv_nsec) / 1e9);
    free(memory);
    return 0;
}
