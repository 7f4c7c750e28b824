set terminal pngcairo size 1400,650 font ',10'
set output 'soak_4x1.png'
set title 'Soak 4x1: step vs time, one fault per ~minute (14 faults)'
set xlabel 'seconds since kubectl apply'
set ylabel 'step'
set key left top
set grid
set yrange [0:4253]
set arrow from 71.2, graph 0 to 71.2, graph 1 nohead lc rgb '#d62728' lw 1.2 dt 2
set label 'kill r0' at 73.2, graph 0.62 rotate by 90 tc rgb '#d62728' font ',8'
set arrow from 130.2, graph 0 to 130.2, graph 1 nohead lc rgb '#1f77b4' lw 1.2 dt 2
set label 'standin' at 132.2, graph 0.72 rotate by 90 tc rgb '#1f77b4' font ',8'
set arrow from 184.2, graph 0 to 184.2, graph 1 nohead lc rgb '#ff7f0e' lw 1.2 dt 2
set label 'stop r2' at 186.2, graph 0.82 rotate by 90 tc rgb '#ff7f0e' font ',8'
set arrow from 253.8, graph 0 to 253.8, graph 1 nohead lc rgb '#9467bd' lw 1.2 dt 2
set label 'delete r3' at 255.8, graph 0.62 rotate by 90 tc rgb '#9467bd' font ',8'
set arrow from 303.5, graph 0 to 303.5, graph 1 nohead lc rgb '#2ca02c' lw 1.2 dt 2
set label 'operator' at 305.5, graph 0.72 rotate by 90 tc rgb '#2ca02c' font ',8'
set arrow from 359.6, graph 0 to 359.6, graph 1 nohead lc rgb '#9467bd' lw 1.2 dt 2
set label 'delete r0' at 361.6, graph 0.82 rotate by 90 tc rgb '#9467bd' font ',8'
set arrow from 410.3, graph 0 to 410.3, graph 1 nohead lc rgb '#ff7f0e' lw 1.2 dt 2
set label 'stop r0' at 412.3, graph 0.62 rotate by 90 tc rgb '#ff7f0e' font ',8'
set arrow from 467.8, graph 0 to 467.8, graph 1 nohead lc rgb '#2ca02c' lw 1.2 dt 2
set label 'operator' at 469.8, graph 0.72 rotate by 90 tc rgb '#2ca02c' font ',8'
set arrow from 545.2, graph 0 to 545.2, graph 1 nohead lc rgb '#1f77b4' lw 1.2 dt 2
set label 'standin' at 547.2, graph 0.82 rotate by 90 tc rgb '#1f77b4' font ',8'
set arrow from 617.2, graph 0 to 617.2, graph 1 nohead lc rgb '#d62728' lw 1.2 dt 2
set label 'kill r0' at 619.2, graph 0.62 rotate by 90 tc rgb '#d62728' font ',8'
set arrow from 677.2, graph 0 to 677.2, graph 1 nohead lc rgb '#2ca02c' lw 1.2 dt 2
set label 'operator' at 679.2, graph 0.72 rotate by 90 tc rgb '#2ca02c' font ',8'
set arrow from 754.1, graph 0 to 754.1, graph 1 nohead lc rgb '#9467bd' lw 1.2 dt 2
set label 'delete r1' at 756.1, graph 0.82 rotate by 90 tc rgb '#9467bd' font ',8'
set arrow from 829.4, graph 0 to 829.4, graph 1 nohead lc rgb '#ff7f0e' lw 1.2 dt 2
set label 'stop r3' at 831.4, graph 0.62 rotate by 90 tc rgb '#ff7f0e' font ',8'
set arrow from 893.4, graph 0 to 893.4, graph 1 nohead lc rgb '#1f77b4' lw 1.2 dt 2
set label 'standin' at 895.4, graph 0.72 rotate by 90 tc rgb '#1f77b4' font ',8'
plot 'soak_4x1_rows.dat' using 1:2 with points pt 7 ps 0.2 lc rgb '#bbbbbb' title 'logged steps (all ranks, incl. redone)', 'soak_4x1_kept.dat' using 1:2 with lines lw 2 lc rgb 'black' title 'kept steps (soak)', 'soak_4x1_base.dat' using 1:2 with lines lw 1.5 dt 3 lc rgb '#555555' title 'undisturbed run'
