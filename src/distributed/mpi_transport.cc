// The MPI transport plugin (libkareus_mpi.so), the only code that links libmpi. Loaded by
// open_mpi_transport; see mpi_loader.cc for why it is a plugin. Waiting polls with MPI_Iprobe
// and short sleeps instead of blocking in MPI_Recv: OpenMPI's blocking receive spins a core,
// and idle measuring ranks share the CPUs with the search on rank 0.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "kareus/distributed.h"

namespace {

using kareus::distributed::Message;
using kareus::distributed::Tag;

class MpiTransport : public kareus::distributed::Transport {
 public:
  MpiTransport() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char name[MPI_MAX_PROCESSOR_NAME] = {0};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    host_.assign(name, static_cast<std::size_t>(len));
    // The measuring ranks of this node, by world rank: this rank's position among them picks
    // its GPU group. MPI-3's shared-memory split works under mpirun and srun alike.
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    int node_size = 0;
    MPI_Comm_size(node, &node_size);
    std::vector<int> ranks(static_cast<std::size_t>(node_size));
    MPI_Allgather(&rank_, 1, MPI_INT, ranks.data(), 1, MPI_INT, node);
    MPI_Comm_free(&node);
    std::sort(ranks.begin(), ranks.end());
    index_ = -1;
    if (rank_ != 0) {
      index_ = 0;
      for (int r : ranks) {
        if (r != 0 && r < rank_) ++index_;
      }
    }
  }
  ~MpiTransport() override { MPI_Finalize(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int node_worker_index() const override { return index_; }
  std::string host() const override { return host_; }

  void send(int dest, Tag tag, const std::string& payload) override {
    MPI_Send(payload.data(), static_cast<int>(payload.size()), MPI_CHAR, dest,
             static_cast<int>(tag), MPI_COMM_WORLD);
  }

  Message receive(int source) override {
    const int src = source < 0 ? MPI_ANY_SOURCE : source;
    MPI_Status st;
    int flag = 0;
    auto pause = std::chrono::microseconds(20);
    for (;;) {
      MPI_Iprobe(src, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
      if (flag) break;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(2000));
    }
    int count = 0;
    MPI_Get_count(&st, MPI_CHAR, &count);
    Message m;
    m.source = st.MPI_SOURCE;
    m.tag = static_cast<Tag>(st.MPI_TAG);
    m.payload.resize(static_cast<std::size_t>(count));
    MPI_Recv(m.payload.data(), count, MPI_CHAR, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD,
             MPI_STATUS_IGNORE);
    return m;
  }

 private:
  int rank_ = 0, size_ = 1, index_ = -1;
  std::string host_;
};

}  // namespace

// Initializes MPI (one thread at a time calls it: the Coordinator serializes) and returns the
// transport, owned by the caller; nullptr with a message in `err` on failure.
extern "C" __attribute__((visibility("default"))) kareus::distributed::Transport* kareus_mpi_open(
    int* argc, char*** argv, char* err, unsigned long err_len) {
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    std::snprintf(err, err_len, "MPI_Init_thread failed");
    return nullptr;
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    std::snprintf(err, err_len, "the MPI library does not support MPI_THREAD_SERIALIZED");
    MPI_Finalize();
    return nullptr;
  }
  return new MpiTransport();
}
