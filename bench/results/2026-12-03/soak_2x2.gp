set terminal pngcairo size 1400,650 font ',10'
set output 'soak_2x2.png'
set title 'Soak 2x2: step vs time, one fault per ~minute (13 faults)'
set xlabel 'seconds since kubectl apply'
set ylabel 'step'
set key left top
set grid
set yrange [0:3395]
set arrow from 54.6, graph 0 to 54.6, graph 1 nohead lc rgb '#9467bd' lw 1.2 dt 2
set label 'delete r0' at 56.6, graph 0.62 rotate by 90 tc rgb '#9467bd' font ',8'
set arrow from 125.8, graph 0 to 125.8, graph 1 nohead lc rgb '#d62728' lw 1.2 dt 2
set label 'kill r3' at 127.8, graph 0.72 rotate by 90 tc rgb '#d62728' font ',8'
set arrow from 178.8, graph 0 to 178.8, graph 1 nohead lc rgb '#1f77b4' lw 1.2 dt 2
set label 'standin' at 180.8, graph 0.82 rotate by 90 tc rgb '#1f77b4' font ',8'
set arrow from 230.2, graph 0 to 230.2, graph 1 nohead lc rgb '#ff7f0e' lw 1.2 dt 2
set label 'stop r0' at 232.2, graph 0.62 rotate by 90 tc rgb '#ff7f0e' font ',8'
set arrow from 295.3, graph 0 to 295.3, graph 1 nohead lc rgb '#2ca02c' lw 1.2 dt 2
set label 'operator' at 297.3, graph 0.72 rotate by 90 tc rgb '#2ca02c' font ',8'
set arrow from 361.4, graph 0 to 361.4, graph 1 nohead lc rgb '#2ca02c' lw 1.2 dt 2
set label 'operator' at 363.4, graph 0.82 rotate by 90 tc rgb '#2ca02c' font ',8'
set arrow from 421.0, graph 0 to 421.0, graph 1 nohead lc rgb '#ff7f0e' lw 1.2 dt 2
set label 'stop r3' at 423.0, graph 0.62 rotate by 90 tc rgb '#ff7f0e' font ',8'
set arrow from 492.1, graph 0 to 492.1, graph 1 nohead lc rgb '#d62728' lw 1.2 dt 2
set label 'kill r0' at 494.1, graph 0.72 rotate by 90 tc rgb '#d62728' font ',8'
set arrow from 562.6, graph 0 to 562.6, graph 1 nohead lc rgb '#1f77b4' lw 1.2 dt 2
set label 'standin' at 564.6, graph 0.82 rotate by 90 tc rgb '#1f77b4' font ',8'
set arrow from 614.9, graph 0 to 614.9, graph 1 nohead lc rgb '#9467bd' lw 1.2 dt 2
set label 'delete r1' at 616.9, graph 0.62 rotate by 90 tc rgb '#9467bd' font ',8'
set arrow from 669.6, graph 0 to 669.6, graph 1 nohead lc rgb '#2ca02c' lw 1.2 dt 2
set label 'operator' at 671.6, graph 0.72 rotate by 90 tc rgb '#2ca02c' font ',8'
set arrow from 725.0, graph 0 to 725.0, graph 1 nohead lc rgb '#d62728' lw 1.2 dt 2
set label 'kill r1' at 727.0, graph 0.82 rotate by 90 tc rgb '#d62728' font ',8'
set arrow from 780.6, graph 0 to 780.6, graph 1 nohead lc rgb '#1f77b4' lw 1.2 dt 2
set label 'standin' at 782.6, graph 0.62 rotate by 90 tc rgb '#1f77b4' font ',8'
plot 'soak_2x2_rows.dat' using 1:2 with points pt 7 ps 0.2 lc rgb '#bbbbbb' title 'logged steps (all ranks, incl. redone)', 'soak_2x2_kept.dat' using 1:2 with lines lw 2 lc rgb 'black' title 'kept steps (soak)', 'soak_2x2_base.dat' using 1:2 with lines lw 1.5 dt 3 lc rgb '#555555' title 'undisturbed run'
