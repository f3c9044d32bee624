// trident: the command-line front door. Subcommands live in cli/cmd_*.cpp and register themselves.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <vector>

#include <unistd.h>

#include "cli/command.h"
#include "platform/process.h"
#include "reference/model/config.h"

namespace trident::cli {
static std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
bool register_command(Command cmd) {
  registry().push_back(std::move(cmd));
  return true;
}
std::string preset_help() {
  std::string h = "model preset:";
  const auto names = trident::model::Config::preset_names();
  for (size_t i = 0; i < names.size(); ++i) h += (i ? ", " : " ") + names[i];
  return h;
}
}  // namespace trident::cli

int main(int argc, char** argv) {
  using namespace trident::cli;
  // OpenMP threads sleep when idle instead of spinning (a spinning pool slows everything else on a loaded machine
  // several-fold); OMP_WAIT_POLICY=active in the environment still wins. libgomp reads the variable when it is
  // loaded, before main, so setting it here takes a re-exec of this binary (same pid, same arguments; once, since
  // the variable is then set). Where the exec fails the run goes on with the library's default.
  if (!std::getenv("OMP_WAIT_POLICY")) {
    setenv("OMP_WAIT_POLICY", "passive", /*overwrite=*/0);
    const std::string self = trident::platform::self_exec_path();
    if (!self.empty()) execv(self.c_str(), argv);
  }
  CLI::App app{"trident: reference, emulator and planner for FSDP x CP x EP MoE training"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "trident 0.1.0");
  auto cmds = registry();
  std::sort(cmds.begin(), cmds.end(), [](const Command& a, const Command& b) { return a.name < b.name; });
  std::map<CLI::App*, Action> actions;
  for (auto& c : cmds) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    actions[sub] = c.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // Bad command lines get the same one-line format and exit code as every other bad input.
    std::string msg = e.what();
    if (argc > 1 && argv[1][0] != '-' &&
        std::none_of(cmds.begin(), cmds.end(), [&](const Command& c) { return c.name == argv[1]; })) {
      msg = std::string("unknown command '") + argv[1] + "' (commands:";
      for (const Command& c : cmds) msg += " " + c.name;
      msg += ")";
    }
    // Point at the help that lists the flag: the subcommand's own when one was named.
    std::string help = "trident --help";
    for (const Command& c : cmds)
      if (argc > 1 && c.name == argv[1]) help = "trident " + c.name + " --help";
    std::fprintf(stderr, "trident: error: %s (see %s)\n", msg.c_str(), help.c_str());
    for (const Command& c : cmds)
      if (argc > 1 && c.name == argv[1]) return c.usage_exit;
    return 1;
  }
  int usage_exit = 1;
  try {
    for (auto& [sub, act] : actions)
      if (sub->parsed()) {
        for (const Command& c : cmds)
          if (c.name == sub->get_name()) usage_exit = c.usage_exit;
        return act();
      }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "trident: error: %s\n", e.what());
    return usage_exit;
  }
  return 0;
}
