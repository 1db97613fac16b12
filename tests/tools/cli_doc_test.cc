// docs/cli.md holds every verb's `--help` verbatim (a `<!-- kareus help: VERB -->` marker, then
// a ```text block); the real binary's help must match it, and every verb must have one, so the
// reference cannot drift from the code. scripts/update-cli-help rewrites the blocks.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "test_util.h"

namespace kareus {
namespace {

/// VERB -> help block text, from docs/cli.md.
std::map<std::string, std::string> documented_help() {
  const std::string doc = test::read_file(test::source_path("docs/cli.md"));
  std::map<std::string, std::string> blocks;
  const std::regex marker("<!-- kareus help: ?([^>]*?) -->\n```text\n");
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), marker); it != std::sregex_iterator();
       ++it) {
    const std::size_t start = static_cast<std::size_t>(it->position() + it->length());
    const std::size_t end = doc.find("\n```\n", start - 1);
    EXPECT_NE(end, std::string::npos) << "unterminated help block for " << (*it)[1];
    if (end == std::string::npos) continue;
    const std::string verb = (*it)[1];
    EXPECT_FALSE(blocks.count(verb)) << "two help blocks for '" << verb << "'";
    blocks[verb] = doc.substr(start, end + 1 - start);
  }
  return blocks;
}

/// The subcommand names a help text lists under "Subcommands:".
std::set<std::string> subcommands(const std::string& help) {
  std::set<std::string> names;
  std::stringstream ss(help);
  bool in = false;
  for (std::string line; std::getline(ss, line);) {
    if (line.rfind("Subcommands:", 0) == 0) {
      in = true;
    } else if (in && line.size() > 2 && line[0] == ' ' && line[2] != ' ') {
      names.insert(line.substr(2, line.find(' ', 2) - 2));
    } else if (in && !line.empty() && line[0] != ' ') {
      in = false;
    }
  }
  return names;
}

TEST(CliDoc, HelpMatchesDocs) {
  const auto blocks = documented_help();
  // Every verb, found by walking the real help from the top: a new verb without a block fails.
  std::vector<std::string> verbs{""};
  std::set<std::string> seen;
  for (std::size_t i = 0; i < verbs.size(); ++i) {
    const std::string verb = verbs[i];
    const auto r = test::run_cli(verb + (verb.empty() ? "" : " ") + "--help");
    ASSERT_EQ(r.exit_code, 0) << verb << ": " << r.err;
    seen.insert(verb);
    for (const auto& sub : subcommands(r.out))
      verbs.push_back(verb.empty() ? sub : verb + " " + sub);
    const auto it = blocks.find(verb);
    if (it == blocks.end()) {
      ADD_FAILURE() << "docs/cli.md has no help block for 'kareus " << verb
                    << "' (add '<!-- kareus help: " << verb
                    << " -->' and run scripts/update-cli-help)";
      continue;
    }
    EXPECT_EQ(it->second, r.out) << "docs/cli.md's help of 'kareus " << verb
                                 << "' is stale: run scripts/update-cli-help BINARY";
  }
  EXPECT_GE(seen.size(), 12u);  // top level, 9 verbs, workload show, plan show
  for (const auto& [verb, text] : blocks) {
    EXPECT_TRUE(seen.count(verb)) << "docs/cli.md documents 'kareus " << verb
                                  << "', which the binary does not have";
  }
}

}  // namespace
}  // namespace kareus
