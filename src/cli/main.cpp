// duet: an inference engine and server for Mixture-of-Experts language models on CPUs.
#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"
#include "dist/launcher.h"

int main(int argc, char** argv) {
  duet::set_command_line(argc, argv);  // dist/launcher.h: re-executed under mpirun if asked
  CLI::App app{"duet: Mixture-of-Experts inference on CPUs"};
  app.require_subcommand(1);
  duet::add_make_model_command(app);
  duet::add_generate_command(app);
  duet::add_serve_command(app);
  duet::add_bench_command(app);
  duet::add_tokenize_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const duet::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
