/* The mpirun launcher's test program: every rank adds rank + 1 across the whole job (MPI_Allreduce,
   so each rank talks to the others, across nodes) and prints what it got and where it ran. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
  int rank, size, length, mine, sum;
  char host[MPI_MAX_PROCESSOR_NAME];
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Get_processor_name(host, &length);
  mine = rank + 1;
  MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  printf("mpi rank %d of %d on %s: sum %d\n", rank, size, host, sum);
  MPI_Finalize();
  return 0;
}
