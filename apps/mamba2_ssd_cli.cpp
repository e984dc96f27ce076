// mamba2-ssd: the command-line tool of the library.
//
//   mamba2-ssd run   [flags]   one timed forward on random inputs (GPU, or the CPU reference)
//   mamba2-ssd check [flags]   the GPU forward against the float64 CPU reference
//   mamba2-ssd tune  [flags]   measure kernel settings, store the fastest in the tuning cache
//
// Subcommands live in the table below: a new one (tune, bench, ...) is a function taking the
// parsed Options, the flag groups it accepts (cli_args.hpp) and its help text.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "cli_args.hpp"
#include "cli_commands.hpp"
#include "mamba2_ssd/api.hpp"
#include "mamba2_ssd/error.hpp"

namespace {

struct Command {
  const char* name;
  const char* summary;      // one line, for the command list
  const char* description;  // the paragraph of `mamba2-ssd <name> --help`
  unsigned groups;          // the flag groups it accepts
  int (*run)(const cli::Options&);
};

const Command kCommands[] = {
    {"run", "one forward on random inputs: time per call, tokens/s, checksums",
     "Runs one forward at the given shape on random inputs (x, B, C = silu(randn),\n"
     "dt = softplus(randn), A = -uniform(1, 16), D, z, dt_bias and initial states\n"
     "randn) and prints the shape and options, the device, the time per call,\n"
     "tokens/s and checksums (sum and sum of |.| of every output, as double) so\n"
     "that runs can be compared. Uses the GPU when this build has CUDA and a\n"
     "Hopper GPU is present (timed with CUDA events over --iters calls after\n"
     "--warmup), else the float64 CPU reference (wall clock).",
     cli::kGroupProblem | cli::kGroupDevice | cli::kGroupTiming, cli::command_run},
    {"check", "the GPU forward against the float64 CPU reference: PASS/FAIL",
     "Runs the forward on the GPU (outputs and workspace poisoned with NaN first)\n"
     "and the float64 CPU reference on the same inputs, and prints the relative\n"
     "L2 error of out, final_states (and varlen_states / chunk_states when\n"
     "requested) against the tolerances, then PASS or FAIL. The GPU is run twice\n"
     "and the two results must be bitwise identical.\n"
     "Exit code: 0 pass, 1 fail or error, 2 bad flags or no CUDA GPU.",
     cli::kGroupProblem | cli::kGroupDevice | cli::kGroupCheck, cli::command_check},
    {"tune", "measure the kernel settings for a shape and store the fastest in the tuning cache",
     "Measures every setting of the tuned kernels (fwd_pass_state: dstate tile,\n"
     "load-ring depth, walk segments; compute_out: heads per CTA; fused_walk: walk\n"
     "segments, and heads per CTA of its specialised kernel at dstate <= 64) on random\n"
     "inputs of the given shape, printing each timing as it comes, and stores the fastest in the\n"
     "tuning cache that forward() reads ($MAMBA2_SSD_TUNING_CACHE, else\n"
     "$XDG_CACHE_HOME/mamba2_ssd/tuning.json or ~/.cache/mamba2_ssd/tuning.json).\n"
     "--sweep tunes the benchmark's shape lists instead. Needs a Hopper GPU.",
     cli::kGroupProblem | cli::kGroupDevice | cli::kGroupTune, cli::command_tune},
};

const Command* find_command(const std::string& name) {
  for (const Command& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

void print_main_help(std::FILE* f) {
  std::fprintf(f,
               "mamba2-ssd %s: Mamba-2 SSD forward (mamba_chunk_scan_combined) on Hopper GPUs\n\n"
               "Usage: mamba2-ssd <command> [flags]\n"
               "       mamba2-ssd <command> --help\n"
               "       mamba2-ssd --version\n\nCommands:\n",
               mamba2_ssd::version());
  for (const Command& c : kCommands) std::fprintf(f, "  %-8s %s\n", c.name, c.summary);
  std::fprintf(f,
               "\nFlags take a value as '--flag V' or '--flag=V'; switches are '--flag', '--no-flag'\n"
               "or '--flag=true|false'. Defaults give the anchor problem: batch 4, seqlen 4096,\n"
               "heads 8, headdim 64, groups 1, dstate 128, chunk 128, bf16, D per head, initial\n"
               "and final states.\n");
  unsigned all = 0;
  for (const Command& c : kCommands) all |= c.groups;
  std::fprintf(f, "%s", cli::flags_help(all).c_str());
  std::fprintf(f, "\nExit codes: 0 success, 1 error or failed check, 2 bad command line or no GPU for check.\n");
}

void print_command_help(const Command& c) {
  std::printf("Usage: mamba2-ssd %s [flags]\n\n%s\n", c.name, c.description);
  std::printf("%s", cli::flags_help(c.groups).c_str());
}

int usage_error(const char* command, const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "mamba2-ssd: error: %s\n", message.c_str());
  if (command) std::fprintf(stderr, "(see 'mamba2-ssd %s --help')\n", command);
  else std::fprintf(stderr, "(see 'mamba2-ssd --help')\n");
  return cli::kExitUsage;
}

int failure(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "error: %s\n", message.c_str());
  return cli::kExitFailure;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "Usage: mamba2-ssd <command> [flags]   (commands:");
    for (const Command& c : kCommands) std::fprintf(stderr, " %s", c.name);
    std::fprintf(stderr, "; see 'mamba2-ssd --help')\n");
    return cli::kExitUsage;
  }
  const std::string first = argv[1];
  if (first == "--help" || first == "-h" || first == "help") {
    if (first == "help" && argc >= 3) {
      const Command* c = find_command(argv[2]);
      if (!c) return usage_error(nullptr, std::string("unknown command '") + argv[2] + "'");
      print_command_help(*c);
      return cli::kExitOk;
    }
    print_main_help(stdout);
    return cli::kExitOk;
  }
  if (first == "--version" || first == "-V") {
    std::printf("mamba2-ssd %s\n", mamba2_ssd::version());
    return cli::kExitOk;
  }
  const Command* cmd = find_command(first);
  if (!cmd) {
    if (first.compare(0, 1, "-") == 0) return usage_error(nullptr, first + ": expected a command before any flag");
    return usage_error(nullptr, "unknown command '" + first + "'");
  }
  try {
    cli::Options opt;
    if (!cli::parse_flags(argc, argv, 2, cmd->groups, opt)) {
      print_command_help(*cmd);
      return cli::kExitOk;
    }
    return cmd->run(opt);
  } catch (const cli::UsageError& e) {
    return usage_error(cmd->name, e.what());
  } catch (const mamba2_ssd::Error& e) {
    return failure(e.what());
  } catch (const std::bad_alloc&) {
    return failure("out of host memory");
  } catch (const std::exception& e) {
    return failure(e.what());
  }
}
