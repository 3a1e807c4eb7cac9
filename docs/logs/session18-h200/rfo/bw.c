// Ceilings of the 16-core host: aggregate copy bandwidth of T threads, in-process memcpy and
// process_vm_readv from a peer process, on huge or small pages.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
#include <emmintrin.h>
static void ntcopy(char*d,const char*s,size_t n){ for(size_t i=0;i<n;i+=64){ __m128i a=_mm_load_si128((const __m128i*)(s+i)),b=_mm_load_si128((const __m128i*)(s+i+16)),c=_mm_load_si128((const __m128i*)(s+i+32)),e=_mm_load_si128((const __m128i*)(s+i+48)); _mm_stream_si128((__m128i*)(d+i),a);_mm_stream_si128((__m128i*)(d+i+16),b);_mm_stream_si128((__m128i*)(d+i+32),c);_mm_stream_si128((__m128i*)(d+i+48),e);} _mm_sfence(); }
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static size_t SZ; static int HUGE; static size_t CALL;
static char* alloc(size_t n, int shared){
  char*p=mmap(0,n+(2<<20),PROT_READ|PROT_WRITE,MAP_ANONYMOUS|(shared?MAP_SHARED:MAP_PRIVATE),-1,0);
  p=(char*)(((size_t)p+(2<<20)-1)&~((size_t)(2<<20)-1));
  if(HUGE&&!shared)madvise(p,n,MADV_HUGEPAGE); if(!HUGE)madvise(p,n,MADV_NOHUGEPAGE);
  memset(p,1,n); return p;}
typedef struct{int id; pid_t pid; char*src; char*dst; int reps; int mode; double t;} Arg;
static pthread_barrier_t bar;
static void* th(void*v){Arg*a=v; pthread_barrier_wait(&bar); double t0=now();
  for(int r=0;r<a->reps;r++){
    if(a->mode==0) memcpy(a->dst,a->src,SZ);
    else if(a->mode==1){volatile long s=0; long*q=(long*)a->src; for(size_t i=0;i<SZ/8;i+=8)s+=q[i];}
    else if(a->mode==2) for(size_t o=0;o<SZ;o+=CALL){struct iovec l={a->dst+o,CALL},rm={a->src+o,CALL}; if(process_vm_readv(a->pid,&l,1,&rm,1,0)!=(ssize_t)CALL){perror("readv");exit(1);}}
    else { static __thread char*scr; if(!scr) scr=aligned_alloc(4096,CALL); for(size_t o=0;o<SZ;o+=CALL){struct iovec l={scr,CALL},rm={a->src+o,CALL}; if(process_vm_readv(a->pid,&l,1,&rm,1,0)!=(ssize_t)CALL){perror("readv");exit(1);} ntcopy(a->dst+o,scr,CALL);} }
  }
  a->t=now()-t0; return 0;}
int main(int argc,char**argv){
  // bw mode T sizeMiB huge [callKiB]: mode 0 memcpy, 1 read, 2 readv from a child process
  int mode=atoi(argv[1]),T=atoi(argv[2]); SZ=(size_t)atoi(argv[3])<<20; HUGE=atoi(argv[4]); CALL=(argc>5?atoi(argv[5]):2048)<<10;
  int reps=5; Arg a[64]; pthread_t t[64]; pthread_barrier_init(&bar,0,T);
  char**srcs=malloc(T*sizeof(char*)); pid_t child=0; int pfd[2]; pipe(pfd);
  // sources: for readv they live in a child process (same addresses after fork)
  for(int i=0;i<T;i++) srcs[i]=alloc(SZ,0);
  if(mode>=2){ child=fork(); if(child==0){char c; read(pfd[0],&c,1); _exit(0);} }
  for(int i=0;i<T;i++){a[i]=(Arg){i,child,srcs[i],alloc(SZ,0),reps,mode,0};}
  // warm
  for(int i=0;i<T;i++){a[i].reps=1;pthread_create(&t[i],0,th,&a[i]);} for(int i=0;i<T;i++)pthread_join(t[i],0);
  for(int i=0;i<T;i++){a[i].reps=reps;pthread_create(&t[i],0,th,&a[i]);} double mx=0;
  for(int i=0;i<T;i++){pthread_join(t[i],0); if(a[i].t>mx)mx=a[i].t;}
  double bytes=(double)SZ*reps*T*(mode==1?1:2);
  printf("mode %s threads %2d size %4zu MiB %s call %zu KiB: %.1f GB/s traffic (%.1f GB/s copied)\n",
    mode==0?"memcpy":mode==1?"read  ":mode==2?"readv ":"readv+nt",T,SZ>>20,HUGE?"huge ":"small",CALL>>10,bytes/mx/1e9,(double)SZ*reps*T/mx/1e9);
  if(child){write(pfd[1],"x",1); waitpid(child,0,0);}
  return 0;}
