// Fuzz target: what soltrain reads from a hub's answers, the network aside: the repository file list
// (model_info's "sha" and "siblings"), a safetensors index's shard names, an ETag header, and the names
// that become cache paths (revision, file, blob). The first byte picks which.
#include "fuzz_util.h"
#include "hub/hub_cache.h"
#include "hub/hub_listing.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace soltrain;
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  const RepoRef r{RepoType::kDataset, "org/name", "main"};
  fuzz::expect_only_user_errors([&] {
    switch (data[0] % 3) {
      case 0: {
        const RepoListing l = parse_repo_listing(text, r, "http://hub");
        if (!is_commit_hash(l.commit)) std::abort();  // a listing is only returned with a commit
        for (const std::string& f : pick_dataset_files(l.files)) (void)is_safe_repo_path(f);
        break;
      }
      case 1:
        for (const std::string& s : parse_shard_index(text, "index.json"))
          if (!is_safe_repo_path(s)) std::abort();  // every returned shard stays in the folder
        break;
      default: {
        // A name accepted as a blob, revision or path never leaves its folder: no absolute path, no empty,
        // "." or ".." part, and a blob name is one part.
        auto leaves = [](const std::string& s) {
          if (s.empty() || s[0] == '/') return true;
          for (size_t start = 0;;) {
            const size_t end = s.find('/', start);
            const std::string part = s.substr(start, end - start);
            if (part.empty() || part == "." || part == "..") return true;
            if (end == std::string::npos) return false;
            start = end + 1;
          }
        };
        const std::string etag = normalize_etag(text);
        if (is_safe_blob_name(etag) && (leaves(etag) || etag.find('/') != std::string::npos)) std::abort();
        if (is_safe_revision(text) && leaves(text)) std::abort();
        if (is_safe_repo_path(text) && leaves(text)) std::abort();
      }
    }
  });
  return 0;
}
