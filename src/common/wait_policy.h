// How long an idle OpenMP thread spins before it sleeps, chosen for cores that other processes may
// share.
//
// libgomp's default (OMP_WAIT_POLICY unset) spins 300,000 times at every barrier and at the end of
// every parallel region before it sleeps: milliseconds of a core. On a quiet machine that saves the
// microseconds of a futex wake-up; when another process runs on the same cores (an eval beside a
// run, two runs, a test suite), the spinning thread burns the time slice its preempted partner
// needs, every region waits for that partner, and a training step slowed 5-20x. nibble's programs
// spin a bounded kDefaultSpinCount times instead, then sleep: on a quiet machine a thread still
// catches the next region of a step while spinning (regions follow each other within microseconds),
// and on shared cores it gives its core back quickly.
//
// libgomp reads its environment once, when it is loaded, before main(): the setting can only be
// made by starting the program again with it. The user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is
// always kept as given.
#pragma once
#include <string>

namespace nibble {

// Spins of libgomp's wait loop (one `pause` each: about 0.05-0.15 us on current x86 cores).
inline constexpr const char* kDefaultSpinCount = "10000";

// The environment variable that says the program was started again with nibble's default (its
// value: the spin count set), so the restarted program does not restart once more.
inline constexpr const char* kSpinCountSetByNibble = "NIBBLE_GOMP_SPINCOUNT_SET";

// Called first in main(). When neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, sets
// GOMP_SPINCOUNT=kDefaultSpinCount and executes the program again (/proc/self/exe, same argv and
// environment). Returns only when nothing needed doing or when the program cannot be executed
// again (no /proc): it then runs with libgomp's default, and describe_wait_policy() says so.
void apply_default_wait_policy(char** argv);

// The policy in force, for reports: "GOMP_SPINCOUNT=10000 (nibble's default)",
// "OMP_WAIT_POLICY=passive (from the environment)", "libgomp's default (300000 spins)".
std::string describe_wait_policy();

// Removes what apply_default_wait_policy() set from this process's environment, for a child that is
// not nibble (PyTorch's benchmark, which has a libgomp of its own): it runs with its own defaults,
// as it would for a user. Call in the child between fork() and exec().
void forget_default_wait_policy();

}  // namespace nibble
