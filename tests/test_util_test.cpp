// The tests' temporary directories: each program's inside its own /tmp/duet-test-<pid>, and what a
// killed program left removed by the next one.
#include "test_util.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace duet::test {
namespace {

TEST(TempDirsTest, AZombieHasEnded) {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  // Not reaped yet: kill(pid, 0) still finds it, /proc says Z once it has exited.
  for (int i = 0; i < 2000 && process_runs(child); ++i) ::usleep(1000);
  EXPECT_FALSE(process_runs(child));
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(process_runs(::getpid()));
}

// A pid that ran and has ended: a child that exits at once, reaped.
pid_t ended_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  return child;
}

TEST(TempDirsTest, MadeInsideThisProgramsOwnDirectory) {
  const std::string dir = make_temp_dir("duet-util-");
  EXPECT_TRUE(std::filesystem::is_directory(dir));
  EXPECT_EQ(std::filesystem::path(dir).parent_path().string(),
            "/tmp/duet-test-" + std::to_string(::getpid()));
  EXPECT_NE(make_temp_dir("duet-util-"), dir);
}

TEST(TempDirsTest, RemovesWhatEndedProgramsLeftAndNothingElse) {
  const std::string root = make_temp_dir("duet-sweep-");
  const std::string dead = root + "/duet-test-" + std::to_string(ended_pid());
  const std::string alive = root + "/duet-test-" + std::to_string(::getpid());
  const std::string other = root + "/duet-test-notapid";
  for (const std::string& d : {dead + "/model", alive + "/model", other}) {
    std::filesystem::create_directories(d);
  }
  write_file(dead + "/model/config.json", "{}");
  EXPECT_EQ(1, remove_dead_test_dirs(root));
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(alive + "/model"));
  EXPECT_TRUE(std::filesystem::exists(other));
}

}  // namespace
}  // namespace duet::test
